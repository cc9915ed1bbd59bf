package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// This file serves and reads Google's Gemini API (generateContent,
// streamGenerateContent with alt=sse, countTokens, the model list):
// requests, answers and streams. Its reading and rewriting are pure, like
// openai.go's; the model, the method and the stream flag come from the
// URL path (POST /v1beta/models/{model}:{method}), not from the body.

// API names of recorded Gemini calls.
const (
	CallGeminiGenerate    = "gemini.generateContent"
	CallGeminiCountTokens = "gemini.countTokens"
)

// geminiPrefix starts every Gemini path the gateway serves.
const geminiPrefix = "/v1beta/models"

// Gemini methods.
const (
	geminiGenerate = "generateContent"
	geminiStream   = "streamGenerateContent"
	geminiCount    = "countTokens"
)

// unsupportedGeminiTools are tools Google runs itself, billed per use or
// with tokens the request does not bound; refused, named.
var unsupportedGeminiTools = map[string]string{
	"googleSearch":          "Google Search grounding is billed per query by the provider",
	"googleSearchRetrieval": "Google Search grounding is billed per query by the provider",
	"codeExecution":         "code execution runs at the provider and bills its own tokens",
	"urlContext":            "URL context fetches pages at the provider and bills their tokens",
	"fileSearch":            "file search reads stores at the provider and bills their tokens",
	"googleMaps":            "Google Maps grounding is billed per query by the provider",
	"enterpriseWebSearch":   "web search is billed per query by the provider",
	"retrieval":             "retrieval reads stores at the provider and bills their tokens",
	"computerUse":           "computer use is not supported by the gateway",
}

// unsupportedGemini are request fields refused, with why.
var unsupportedGemini = map[string]string{
	"cachedContent": "it names a context cache kept at the provider, whose contents the trajectory would not hold and whose tokens the request does not bound; send the contents in the request (implicit caching still applies and is priced as cached input)",
}

// parseGeminiPath reads a Gemini path: /v1beta/models (list),
// /v1beta/models/{model} (get) or /v1beta/models/{model}:{method}.
func parseGeminiPath(path string) (model, method string, err error) {
	rest, ok := strings.CutPrefix(path, geminiPrefix)
	if !ok || (rest != "" && rest[0] != '/') {
		return "", "", fmt.Errorf("no endpoint %s", path)
	}
	rest = strings.TrimPrefix(rest, "/")
	if rest == "" {
		return "", "", nil
	}
	model = rest
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		model, method = rest[:i], rest[i+1:]
	}
	if model == "" {
		return "", "", fmt.Errorf("no model in %s", path)
	}
	return model, method, nil
}

// parseGeminiRequest reads a generateContent request body for model
// (named in the path); stream says it came to streamGenerateContent.
// Google's JSON parser takes a field by its proto name
// (generation_config, max_output_tokens) as well as by its JSON name, so
// every field the gateway reads must be spelled by its JSON name: another
// spelling is refused, lest the provider read what the gateway did not.
func parseGeminiRequest(body []byte, model string, stream bool) (callRequest, error) {
	r := callRequest{Model: model, Stream: stream, IncludeUsage: stream, Choices: 1}
	if err := json.Unmarshal(body, &r.fields); err != nil {
		return r, fmt.Errorf("request body is not a JSON object: %w", err)
	}
	if r.fields == nil {
		return r, errors.New("request body is null, not a JSON object")
	}
	if err := spelledAs("", r.fields, "contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "cachedContent", "model"); err != nil {
		return r, err
	}
	for f, why := range unsupportedGemini {
		if v, ok := r.fields[f]; ok && string(v) != "null" && string(v) != `""` {
			return r, fmt.Errorf("%s is not supported by the gateway: %s", f, why)
		}
	}
	var tools []map[string]json.RawMessage
	if err := jsonField(r.fields, "tools", &tools); err != nil {
		return r, err
	}
	for i, t := range tools {
		for k := range t {
			if k == "functionDeclarations" {
				continue
			}
			why, known := unsupportedGeminiTools[k]
			if !known {
				why = "only functionDeclarations, which the agent runs, are passed"
			}
			return r, fmt.Errorf("tools[%d]: %s is not supported by the gateway: %s", i, k, why)
		}
	}
	var gcFields map[string]json.RawMessage
	if err := jsonField(r.fields, "generationConfig", &gcFields); err != nil {
		return r, err
	}
	if err := spelledAs("generationConfig.", gcFields, "maxOutputTokens", "candidateCount", "responseModalities", "speechConfig", "imageConfig", "thinkingConfig"); err != nil {
		return r, err
	}
	var gc struct {
		MaxOutputTokens    *int64                     `json:"maxOutputTokens"`
		CandidateCount     *int64                     `json:"candidateCount"`
		ResponseModalities []string                   `json:"responseModalities"`
		ThinkingConfig     map[string]json.RawMessage `json:"thinkingConfig"`
	}
	if err := jsonField(r.fields, "generationConfig", &gc); err != nil {
		return r, err
	}
	if err := spelledAs("generationConfig.thinkingConfig.", gc.ThinkingConfig, "thinkingBudget"); err != nil {
		return r, err
	}
	if gc.MaxOutputTokens != nil {
		if *gc.MaxOutputTokens < 1 {
			return r, fmt.Errorf("generationConfig.maxOutputTokens %d is below 1", *gc.MaxOutputTokens)
		}
		r.Requested = *gc.MaxOutputTokens
	}
	if gc.CandidateCount != nil {
		r.Choices = *gc.CandidateCount
	}
	if r.Choices < 1 || r.Choices > maxChoices {
		return r, fmt.Errorf("generationConfig.candidateCount %d is not in [1, %d]", r.Choices, maxChoices)
	}
	for _, m := range gc.ResponseModalities {
		if !strings.EqualFold(m, "TEXT") {
			return r, fmt.Errorf("generationConfig.responseModalities %q is not supported by the gateway: only text output is priced", m)
		}
	}
	for _, k := range []string{"speechConfig", "imageConfig"} {
		if v, ok := gcFields[k]; ok && string(v) != "null" {
			return r, fmt.Errorf("generationConfig.%s is not supported by the gateway: only text output is priced", k)
		}
	}
	var contents []map[string]json.RawMessage
	if err := jsonField(r.fields, "contents", &contents); err != nil {
		return r, err
	}
	if len(contents) == 0 {
		return r, errors.New("contents is required and not empty")
	}
	var system map[string]json.RawMessage
	if err := jsonField(r.fields, "systemInstruction", &system); err != nil {
		return r, err
	}
	if system != nil {
		n, err := countGeminiContent(system)
		if err != nil {
			return r, fmt.Errorf("systemInstruction.%w", err)
		}
		r.Images += n
	}
	for i, c := range contents {
		n, err := countGeminiContent(c)
		if err != nil {
			return r, fmt.Errorf("contents[%d].%w", i, err)
		}
		r.Images += n
	}
	return r, nil
}

// spelledAs refuses a field of fields that is one of names spelled
// otherwise (max_output_tokens, MaxOutputTokens for maxOutputTokens).
func spelledAs(where string, fields map[string]json.RawMessage, names ...string) error {
	for k := range fields {
		if slices.Contains(names, k) {
			continue
		}
		fk := foldName(k)
		for _, n := range names {
			if fk == foldName(n) {
				return fmt.Errorf("%s%s: write it as %s (the gateway reads Gemini fields by their JSON names only)", where, k, n)
			}
		}
	}
	return nil
}

func foldName(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// countGeminiContent checks a Content's parts (countGeminiParts).
func countGeminiContent(c map[string]json.RawMessage) (int64, error) {
	if err := spelledAs("", c, "parts"); err != nil {
		return 0, err
	}
	var parts []map[string]json.RawMessage
	if err := jsonField(c, "parts", &parts); err != nil {
		return 0, err
	}
	return countGeminiParts(parts, 0)
}

// countGeminiParts checks parts for data whose tokens the gateway can
// bound and counts their images (a function response's included). Text,
// function calls and responses, thoughts, code and its results are text
// in the body, bounded by its bytes; an inline image is bounded by the
// model's image_tokens; a file stored at the provider (fileData) and
// inline audio, video or documents are refused.
func countGeminiParts(parts []map[string]json.RawMessage, depth int) (int64, error) {
	if depth > 1 {
		return 0, errors.New("parts nested too deep")
	}
	var images int64
	for j, p := range parts {
		if err := spelledAs(fmt.Sprintf("parts[%d].", j), p, "inlineData", "fileData", "functionResponse"); err != nil {
			return 0, err
		}
		if v, ok := p["fileData"]; ok && string(v) != "null" {
			return 0, fmt.Errorf("parts[%d]: fileData is not supported by the gateway: it names a file stored at the provider, whose tokens the request does not bound (send it as inlineData)", j)
		}
		if v, ok := p["inlineData"]; ok && string(v) != "null" {
			var d map[string]json.RawMessage
			if err := json.Unmarshal(v, &d); err != nil {
				return 0, fmt.Errorf("parts[%d].inlineData: %w", j, err)
			}
			if err := spelledAs(fmt.Sprintf("parts[%d].inlineData.", j), d, "mimeType"); err != nil {
				return 0, err
			}
			var mime string
			if err := jsonField(d, "mimeType", &mime); err != nil {
				return 0, fmt.Errorf("parts[%d].inlineData.%w", j, err)
			}
			switch m := strings.ToLower(mime); {
			case strings.HasPrefix(m, "image/"):
				images++
			case strings.HasPrefix(m, "text/"):
			default:
				return 0, fmt.Errorf("parts[%d]: inlineData of type %q is not supported by the gateway (its tokens cannot be bounded; images and text are)", j, mime)
			}
		}
		if v, ok := p["functionResponse"]; ok && string(v) != "null" {
			var fr map[string]json.RawMessage
			if err := json.Unmarshal(v, &fr); err != nil {
				return 0, fmt.Errorf("parts[%d].functionResponse: %w", j, err)
			}
			if err := spelledAs(fmt.Sprintf("parts[%d].functionResponse.", j), fr, "parts"); err != nil {
				return 0, err
			}
			var inner []map[string]json.RawMessage
			if err := jsonField(fr, "parts", &inner); err != nil {
				return 0, fmt.Errorf("parts[%d].functionResponse.%w", j, err)
			}
			n, err := countGeminiParts(inner, depth+1)
			if err != nil {
				return 0, fmt.Errorf("parts[%d].functionResponse.%w", j, err)
			}
			images += n
		}
	}
	return images, nil
}

// rewriteGemini is the body sent to the provider: the client's, with
// generationConfig.maxOutputTokens set to maxOut (whatever the client
// set: the plan is never above it) and a thinking budget at or above
// maxOut lowered below it. Gemini counts thinking tokens against
// maxOutputTokens (a thinking budget is a target the model may pass, not
// a bound), so maxOutputTokens bounds the call's whole output; a budget
// at or above it would leave no room for the answer. A model name in the
// body (some clients send one) becomes the upstream name.
func rewriteGemini(r callRequest, upstream string, maxOut int64) ([]byte, error) {
	f := r.edit()
	gc := map[string]json.RawMessage{}
	if raw, ok := f["generationConfig"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &gc); err != nil {
			return nil, fmt.Errorf("generationConfig: %w", err)
		}
	}
	b, _ := json.Marshal(maxOut)
	gc["maxOutputTokens"] = b
	if raw, ok := gc["thinkingConfig"]; ok && string(raw) != "null" {
		var t map[string]json.RawMessage
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("generationConfig.thinkingConfig: %w", err)
		}
		var budget *int64
		if err := jsonField(t, "thinkingBudget", &budget); err != nil {
			return nil, fmt.Errorf("generationConfig.thinkingConfig: %w", err)
		}
		if budget != nil && *budget >= maxOut {
			t["thinkingBudget"], _ = json.Marshal(max(maxOut-1, 0))
			gc["thinkingConfig"], _ = json.Marshal(t)
		}
	}
	f.set("generationConfig", gc)
	if raw, ok := f["model"]; ok && string(raw) != "null" {
		f.set("model", "models/"+upstream)
	}
	return marshalFields(f)
}

// geminiEndpoint is the provider's URL for a call: the model's base
// (rt.endpoint: base URL + "/v1beta/models/" + upstream) and the method;
// a stream is asked for as server-sent events.
func geminiEndpoint(rt route, method string) string {
	if method == geminiStream {
		return rt.endpoint + ":" + geminiStream + "?alt=sse"
	}
	return rt.endpoint + ":" + method
}

// geminiUsage is Gemini's usageMetadata. Counts Google leaves out are
// zero (its JSON omits zero fields).
type geminiUsage struct {
	PromptTokenCount        *int64 `json:"promptTokenCount"`
	CandidatesTokenCount    int64  `json:"candidatesTokenCount"`
	ThoughtsTokenCount      int64  `json:"thoughtsTokenCount"`
	CachedContentTokenCount int64  `json:"cachedContentTokenCount"`
	ToolUsePromptTokenCount int64  `json:"toolUsePromptTokenCount"`
	TotalTokenCount         int64  `json:"totalTokenCount"`
}

// usage is u as the gateway prices it: input is the prompt (cached
// tokens included, as Google counts them) and any tool-use prompt; output
// is the candidates' tokens and the thoughts' (Google bills thinking as
// output), or, when totalTokenCount says more, what the total leaves
// after the input: tokens Google counts but does not attribute are
// charged as output, the dearest kind.
func (u geminiUsage) usage() (Usage, error) {
	if u.PromptTokenCount == nil {
		return Usage{}, errors.New("usageMetadata lacks promptTokenCount")
	}
	in := add(*u.PromptTokenCount, u.ToolUsePromptTokenCount)
	for _, v := range []int64{*u.PromptTokenCount, u.CandidatesTokenCount, u.ThoughtsTokenCount, u.CachedContentTokenCount, u.ToolUsePromptTokenCount, u.TotalTokenCount} {
		if v < 0 {
			return Usage{}, fmt.Errorf("usageMetadata has a negative count: %+v", u)
		}
	}
	out := add(u.CandidatesTokenCount, u.ThoughtsTokenCount)
	if u.TotalTokenCount > add(in, out) {
		out = u.TotalTokenCount - in
	}
	return valid(Usage{Input: in, Output: out, CachedInput: u.CachedContentTokenCount})
}

// parseGeminiResponse reads a non-streaming answer's usage.
func parseGeminiResponse(body []byte) (Usage, bool, error) {
	var r struct {
		UsageMetadata *geminiUsage `json:"usageMetadata"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return Usage{}, false, fmt.Errorf("answer is not a JSON object: %w", err)
	}
	if r.UsageMetadata == nil {
		return Usage{}, false, nil
	}
	u, err := r.UsageMetadata.usage()
	return u, err == nil, err
}

// maxGeminiParts bounds the parts an assembler keeps of one candidate.
const maxGeminiParts = 4096

// geminiAssembler rebuilds a GenerateContentResponse from its stream of
// chunks (each one a GenerateContentResponse; usageMetadata, when the
// stream ends properly, on the last).
type geminiAssembler struct {
	candidates []*geminiCandidateAcc
	top        map[string]json.RawMessage // the last chunk's other fields (modelVersion, responseId, promptFeedback, createTime)
	usage      *geminiUsage
	// final: usage came on or after the chunk that ended the stream.
	final   bool
	blocked bool // promptFeedback.blockReason: no candidate will come
	errObj  json.RawMessage
}

type geminiCandidateAcc struct {
	role   string
	parts  []*geminiPartAcc
	finish json.RawMessage
	other  map[string]json.RawMessage // the last chunk's other candidate fields (safetyRatings, citationMetadata …)
}

// geminiPartAcc is one part of an answer: a text part's text (and its
// thought flag and signature) as it grows, or any other part as it came.
type geminiPartAcc struct {
	fields  map[string]json.RawMessage // a part other than text
	text    strings.Builder
	thought bool
	sig     json.RawMessage
}

// geminiChunk is what the assembler reads of a stream chunk in one pass:
// every field Gemini's GenerateContentResponse and Candidate have (the
// chunk's bytes, recorded as they came, keep any other).
type geminiChunk struct {
	Candidates []struct {
		Index   int `json:"index"`
		Content *struct {
			Role  string                       `json:"role"`
			Parts []map[string]json.RawMessage `json:"parts"`
		} `json:"content"`
		FinishReason       json.RawMessage `json:"finishReason"`
		FinishMessage      json.RawMessage `json:"finishMessage"`
		SafetyRatings      json.RawMessage `json:"safetyRatings"`
		CitationMetadata   json.RawMessage `json:"citationMetadata"`
		GroundingMetadata  json.RawMessage `json:"groundingMetadata"`
		URLContextMetadata json.RawMessage `json:"urlContextMetadata"`
		AvgLogprobs        json.RawMessage `json:"avgLogprobs"`
		LogprobsResult     json.RawMessage `json:"logprobsResult"`
		TokenCount         json.RawMessage `json:"tokenCount"`
	} `json:"candidates"`
	UsageMetadata  *geminiUsage    `json:"usageMetadata"`
	PromptFeedback json.RawMessage `json:"promptFeedback"`
	ModelVersion   json.RawMessage `json:"modelVersion"`
	ResponseID     json.RawMessage `json:"responseId"`
	CreateTime     json.RawMessage `json:"createTime"`
	Error          json.RawMessage `json:"error"`
}

// Event takes the data of one event.
func (a *geminiAssembler) Event(data []byte) (chunkInfo, error) {
	var c geminiChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return chunkInfo{}, fmt.Errorf("stream chunk: %w", err)
	}
	var info chunkInfo
	if a.top == nil {
		a.top = map[string]json.RawMessage{}
	}
	keep := func(to map[string]json.RawMessage, k string, v json.RawMessage) {
		if len(v) > 0 && string(v) != "null" {
			to[k] = v
		}
	}
	keep(a.top, "promptFeedback", c.PromptFeedback)
	keep(a.top, "modelVersion", c.ModelVersion)
	keep(a.top, "responseId", c.ResponseID)
	keep(a.top, "createTime", c.CreateTime)
	if len(c.Error) > 0 && string(c.Error) != "null" {
		a.errObj = c.Error
	}
	if len(c.PromptFeedback) > 0 {
		var pf struct {
			BlockReason string `json:"blockReason"`
		}
		if json.Unmarshal(c.PromptFeedback, &pf) == nil && pf.BlockReason != "" {
			a.blocked = true
		}
	}
	for _, cand := range c.Candidates {
		acc, err := slot(&a.candidates, cand.Index, maxChoices, "candidate")
		if err != nil {
			return info, err
		}
		if cand.Content != nil {
			acc.role = cmpOr(cand.Content.Role, acc.role)
			for _, p := range cand.Content.Parts {
				tok, err := acc.add(p)
				if err != nil {
					return info, err
				}
				info.Token = info.Token || tok
			}
		}
		if len(cand.FinishReason) > 0 && string(cand.FinishReason) != "null" {
			acc.finish = cand.FinishReason
		}
		if acc.other == nil {
			acc.other = map[string]json.RawMessage{}
		}
		keep(acc.other, "finishMessage", cand.FinishMessage)
		keep(acc.other, "safetyRatings", cand.SafetyRatings)
		keep(acc.other, "citationMetadata", cand.CitationMetadata)
		keep(acc.other, "groundingMetadata", cand.GroundingMetadata)
		keep(acc.other, "urlContextMetadata", cand.URLContextMetadata)
		keep(acc.other, "avgLogprobs", cand.AvgLogprobs)
		keep(acc.other, "logprobsResult", cand.LogprobsResult)
		keep(acc.other, "tokenCount", cand.TokenCount)
	}
	info.Done = a.Complete()
	if c.UsageMetadata != nil {
		a.usage = c.UsageMetadata
		a.final = info.Done
	}
	return info, nil
}

// textPart reads a part that holds only text (and maybe its thought
// flag and signature); ok is false for any other part.
func textPart(p map[string]json.RawMessage) (text string, thought bool, sig json.RawMessage, ok bool) {
	for k := range p {
		if k != "text" && k != "thought" && k != "thoughtSignature" {
			return "", false, nil, false
		}
	}
	if json.Unmarshal(p["text"], &text) != nil {
		return "", false, nil, false
	}
	_ = json.Unmarshal(p["thought"], &thought)
	if v, has := p["thoughtSignature"]; has && string(v) != "null" {
		sig = v
	}
	return text, thought, sig, true
}

// add appends part p and says whether it is output (an empty text part,
// which Gemini's last chunk often has, is dropped). Text joins the text
// part before it when both are of the same kind (thought or answer) and
// at most one has a thought signature, which the joined part keeps: a
// stream cuts the model's text into chunks, the answer has it whole.
func (c *geminiCandidateAcc) add(p map[string]json.RawMessage) (bool, error) {
	t, thought, sig, isText := textPart(p)
	if isText {
		if t == "" && sig == nil {
			return false, nil
		}
		if n := len(c.parts); n > 0 {
			prev := c.parts[n-1]
			if prev.fields == nil && prev.thought == thought && (prev.sig == nil || sig == nil) {
				prev.text.WriteString(t)
				if sig != nil {
					prev.sig = sig
				}
				return t != "", nil
			}
		}
	}
	if len(c.parts) >= maxGeminiParts {
		return false, fmt.Errorf("stream: over %d parts in a candidate", maxGeminiParts)
	}
	part := &geminiPartAcc{thought: thought, sig: sig}
	if isText {
		part.text.WriteString(t)
	} else {
		part.fields = p
	}
	c.parts = append(c.parts, part)
	return !isText || t != "", nil
}

// json is the part as the answer has it.
func (p *geminiPartAcc) json() map[string]json.RawMessage {
	if p.fields != nil {
		return p.fields
	}
	out := map[string]json.RawMessage{}
	out["text"], _ = json.Marshal(p.text.String())
	if p.thought {
		out["thought"] = json.RawMessage("true")
	}
	if p.sig != nil {
		out["thoughtSignature"] = p.sig
	}
	return out
}

// Usage is the stream's final usage: found is false when none came; a
// stream that ended before its last chunk has none (the counts of the
// chunks before are running counts, not what the call cost).
func (a *geminiAssembler) Usage() (Usage, bool, error) {
	if a.usage == nil {
		return Usage{}, false, nil
	}
	if !a.final {
		return Usage{}, false, errors.New("the stream ended before its final usageMetadata (on the chunk with every candidate's finishReason)")
	}
	u, err := a.usage.usage()
	return u, err == nil, err
}

// Complete says whether the stream ended as it should: every candidate
// has its finishReason, or the prompt was blocked.
func (a *geminiAssembler) Complete() bool {
	if a.blocked {
		return true
	}
	if len(a.candidates) == 0 {
		return false
	}
	for _, c := range a.candidates {
		if c.finish == nil {
			return false
		}
	}
	return true
}

// Response is the GenerateContentResponse the stream amounts to.
func (a *geminiAssembler) Response() []byte {
	out := map[string]any{}
	for k, v := range a.top {
		out[k] = v
	}
	cands := make([]map[string]any, 0, len(a.candidates))
	for i, c := range a.candidates {
		m := map[string]any{}
		for k, v := range c.other {
			m[k] = v
		}
		parts := make([]map[string]json.RawMessage, 0, len(c.parts))
		for _, p := range c.parts {
			parts = append(parts, p.json())
		}
		m["content"] = map[string]any{"role": cmpOr(c.role, "model"), "parts": parts}
		if c.finish != nil {
			m["finishReason"] = c.finish
		}
		m["index"] = i
		cands = append(cands, m)
	}
	if len(cands) > 0 {
		out["candidates"] = cands
	}
	if a.usage != nil {
		out["usageMetadata"] = a.usage
	}
	if a.errObj != nil {
		out["error"] = a.errObj
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(out)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// geminiTexts are the text parts (not thoughts) of an answer's
// candidates (HAL's outputs).
func geminiTexts(body []byte) []string {
	var r struct {
		Candidates []struct {
			Content struct {
				Parts []struct {
					Text    string `json:"text"`
					Thought bool   `json:"thought"`
				} `json:"parts"`
			} `json:"content"`
		} `json:"candidates"`
	}
	if json.Unmarshal(body, &r) != nil {
		return []string{}
	}
	out := make([]string, 0, len(r.Candidates))
	for _, c := range r.Candidates {
		var s strings.Builder
		for _, p := range c.Content.Parts {
			if !p.Thought {
				s.WriteString(p.Text)
			}
		}
		out = append(out, s.String())
	}
	return out
}

// geminiAdapter is the adapter of one Gemini call: model, method and
// stream come from its path.
func geminiAdapter(model, method string) adapter {
	stream := method == geminiStream
	return adapter{api: APIGemini, call: CallGeminiGenerate,
		parse: func(b []byte) (callRequest, error) { return parseGeminiRequest(b, model, stream) },
		rewrite: func(r callRequest, rt route, n int64) ([]byte, error) {
			return rewriteGemini(r, rt.model.Upstream, n)
		},
		endpoint:  func(rt route) string { return geminiEndpoint(rt, method) },
		response:  parseGeminiResponse,
		assembler: func() assembler { return &geminiAssembler{} }}
}

// serveGemini serves the Gemini API's paths.
func (g *Gateway) serveGemini(w http.ResponseWriter, r *http.Request) {
	model, method, err := parseGeminiPath(r.URL.Path)
	if err != nil {
		writeAPIError(w, APIGemini, http.StatusNotFound, errNotFound, err.Error()+" (the gateway serves /v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse and :countTokens)")
		return
	}
	switch method {
	case "":
		g.serveGeminiModels(w, r, model)
	case geminiGenerate:
		g.serveCall(w, r, geminiAdapter(model, method))
	case geminiStream:
		if r.URL.Query().Get("alt") != "sse" {
			writeAPIError(w, APIGemini, http.StatusBadRequest, errInvalidRequest, "streamGenerateContent is served as server-sent events only: add ?alt=sse")
			return
		}
		g.serveCall(w, r, geminiAdapter(model, method))
	case geminiCount:
		g.serveGeminiCount(w, r, model)
	default:
		writeAPIError(w, APIGemini, http.StatusNotFound, errNotFound, fmt.Sprintf("method %q is not served (the gateway serves generateContent, streamGenerateContent and countTokens)", method))
	}
}

// geminiModel is a Model as Gemini's model list gives it.
type geminiModel struct {
	Name                       string   `json:"name"`
	BaseModelID                string   `json:"baseModelId"`
	Version                    string   `json:"version"`
	DisplayName                string   `json:"displayName"`
	OutputTokenLimit           int64    `json:"outputTokenLimit"`
	SupportedGenerationMethods []string `json:"supportedGenerationMethods"`
}

// serveGeminiModels lists the Gemini models the token may call (GET
// /v1beta/models), or gives one (GET /v1beta/models/{model}).
func (g *Gateway) serveGeminiModels(w http.ResponseWriter, r *http.Request, one string) {
	if r.Method != http.MethodGet {
		writeAPIError(w, APIGemini, http.StatusMethodNotAllowed, errInvalidRequest, "use GET")
		return
	}
	grant, status, typ, err := g.authorize(r.Context(), r)
	if err != nil {
		writeAPIError(w, APIGemini, status, typ, err.Error())
		return
	}
	one = strings.TrimPrefix(one, "models/")
	list := []geminiModel{}
	for name, rt := range g.routes {
		if rt.provider.API != APIGemini || (len(grant.Models) > 0 && !slices.Contains(grant.Models, name)) {
			continue
		}
		if one != "" && one != name {
			continue
		}
		list = append(list, geminiModel{Name: "models/" + name, BaseModelID: name, Version: "repronet", DisplayName: name,
			OutputTokenLimit: rt.model.MaxOutput, SupportedGenerationMethods: []string{geminiGenerate, geminiCount}})
	}
	if one != "" {
		if len(list) == 0 {
			writeAPIError(w, APIGemini, http.StatusNotFound, errNotFound, fmt.Sprintf("model %q is not offered by the gateway", one))
			return
		}
		writeJSON(w, list[0])
		return
	}
	slices.SortFunc(list, func(a, b geminiModel) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(w, map[string]any{"models": list})
}

// serveGeminiCount serves countTokens: forwarded to the provider, which
// does not bill it, and recorded in the attempt's trajectory and chain,
// charged nothing (no budget is reserved; a replay attempt gets the
// recorded answer, as for any call).
func (g *Gateway) serveGeminiCount(w http.ResponseWriter, r *http.Request, model string) {
	start := g.now()
	ctx := r.Context()
	a := adapter{api: APIGemini, call: CallGeminiCountTokens,
		parse: func(b []byte) (callRequest, error) { return parseGeminiCount(b, model) },
		rewrite: func(req callRequest, rt route, _ int64) ([]byte, error) {
			return rewriteGeminiCount(req, rt.model.Upstream)
		},
		endpoint: func(rt route) string { return geminiEndpoint(rt, geminiCount) },
		response: func([]byte) (Usage, bool, error) { return Usage{}, true, nil }}
	grant, body, req, ok := g.readCall(w, r, a)
	if !ok {
		return
	}
	rt, ok := g.routes[req.Model]
	if !ok || rt.provider.API != APIGemini {
		writeAPIError(w, a.api, http.StatusNotFound, errNotFound, fmt.Sprintf("Gemini model %q is not offered by the gateway", req.Model))
		return
	}
	if err := grant.Permits(grant.Node, "", req.Model, start); err != nil {
		writeAPIError(w, a.api, http.StatusForbidden, errPermission, err.Error())
		return
	}
	if grant.Replay != "" {
		g.serveReplay(w, r, a, grant, req, body, start)
		return
	}
	fwd, err := a.rewrite(req, rt, 0)
	if err != nil {
		writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	c := Call{Attempt: grant.Attempt, Lease: grant.Lease, Node: grant.Node.String(), Evaluation: grant.Evaluation,
		Group: grant.Group, Task: grant.Task, API: a.call, Model: req.Model, Upstream: rt.model.Upstream,
		Provider: rt.provider.Name, Started: start.UTC()}
	c.Request = g.put(ctx, body)
	if !bytes.Equal(fwd, body) {
		c.Forwarded = g.put(ctx, fwd)
	}
	var once sync.Once
	settle := func() { once.Do(func() { c.Chain = g.finish(ctx, c) }) }
	defer settle()
	g.forward(ctx, w, callExtra{}, a, rt, req, fwd, &c, settle)
}

// parseGeminiCount reads a countTokens body: contents, or a whole
// generateContentRequest (which is checked as generateContent's).
func parseGeminiCount(body []byte, model string) (callRequest, error) {
	r := callRequest{Model: model, Choices: 1}
	if err := json.Unmarshal(body, &r.fields); err != nil {
		return r, fmt.Errorf("request body is not a JSON object: %w", err)
	}
	if r.fields == nil {
		return r, errors.New("request body is null, not a JSON object")
	}
	if raw, ok := r.fields["generateContentRequest"]; ok && string(raw) != "null" {
		if _, err := parseGeminiRequest(raw, model, false); err != nil {
			return r, fmt.Errorf("generateContentRequest: %w", err)
		}
	}
	return r, nil
}

// rewriteGeminiCount names the upstream model in a countTokens body's
// generateContentRequest (which must name one), else passes it as it
// came.
func rewriteGeminiCount(r callRequest, upstream string) ([]byte, error) {
	raw, ok := r.fields["generateContentRequest"]
	if !ok || string(raw) == "null" {
		return marshalFields(r.fields)
	}
	var inner map[string]json.RawMessage
	if err := json.Unmarshal(raw, &inner); err != nil {
		return nil, fmt.Errorf("generateContentRequest: %w", err)
	}
	inner["model"], _ = json.Marshal("models/" + upstream)
	f := r.edit()
	f.set("generateContentRequest", inner)
	return marshalFields(f)
}

// geminiStatus is the google.rpc status Gemini's errors name for an HTTP
// status.
func geminiStatus(code int) string {
	switch code {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusPaymentRequired:
		return "RESOURCE_EXHAUSTED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusMethodNotAllowed:
		return "UNIMPLEMENTED"
	case http.StatusConflict:
		return "ABORTED"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	}
	return "INTERNAL"
}

// geminiError is a Gemini error body: {"error": {"code", "message",
// "status"}}, the gateway's error type in the message's first word.
func geminiError(status int, typ, msg string) any {
	return map[string]any{"error": map[string]any{"code": status, "message": typ + ": " + msg, "status": geminiStatus(status)}}
}

// servedAt is the endpoint a model of api is served at.
func servedAt(api string) string {
	switch api {
	case APIAnthropic:
		return "/v1/messages"
	case APIGemini:
		return geminiPrefix + "/{model}:generateContent"
	}
	return "/v1/chat/completions"
}
