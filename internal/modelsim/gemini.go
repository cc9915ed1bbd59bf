package modelsim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// This file speaks Google's Gemini API: POST
// /v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse
// and :countTokens, the key in x-goog-api-key or ?key=.

// geminiPath reads /v1beta/models/{model}:{method}.
func geminiPath(path string) (model, method string, ok bool) {
	rest, ok := strings.CutPrefix(path, "/v1beta/models/")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", "", false
	}
	model, method = rest[:i], rest[i+1:]
	switch method {
	case "generateContent", "streamGenerateContent", "countTokens":
		return model, method, true
	}
	return "", "", false
}

// geminiKey is the key a Gemini request presents.
func geminiKey(r *http.Request) string {
	if k := r.Header.Get("x-goog-api-key"); k != "" {
		return k
	}
	return r.URL.Query().Get("key")
}

// ParseGemini reads a generateContent request body for model (named in
// the path); stream says it came to streamGenerateContent. The system
// instruction is a system message; a user turn's functionResponse parts
// become tool messages (in order, answering the call of the same id, or
// of the same name when it has none), its other text a user message
// after them; a model turn's functionCall parts are its tool calls.
func ParseGemini(body []byte, model string, stream bool) (Request, error) {
	var b struct {
		Contents          []gmContent `json:"contents"`
		SystemInstruction *gmContent  `json:"systemInstruction"`
		Tools             []struct {
			FunctionDeclarations []struct {
				Name string `json:"name"`
			} `json:"functionDeclarations"`
		} `json:"tools"`
		ToolConfig *struct {
			FunctionCallingConfig struct {
				Mode                 string   `json:"mode"`
				AllowedFunctionNames []string `json:"allowedFunctionNames"`
			} `json:"functionCallingConfig"`
		} `json:"toolConfig"`
		GenerationConfig struct {
			MaxOutputTokens *int64 `json:"maxOutputTokens"`
		} `json:"generationConfig"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return Request{}, fmt.Errorf("generateContent request: %w", err)
	}
	if model == "" {
		return Request{}, errors.New("generateContent request: model is required")
	}
	if len(b.Contents) == 0 {
		return Request{}, errors.New("generateContent request: contents is empty")
	}
	req := Request{API: "gemini", Model: model, Stream: stream, BodyBytes: len(body), ToolChoice: "auto"}
	if m := b.GenerationConfig.MaxOutputTokens; m != nil {
		if *m < 1 {
			return Request{}, fmt.Errorf("generateContent request: maxOutputTokens %d is below 1", *m)
		}
		req.MaxTokens = *m
	}
	if tc := b.ToolConfig; tc != nil {
		switch fc := tc.FunctionCallingConfig; strings.ToUpper(fc.Mode) {
		case "", "AUTO", "VALIDATED":
		case "NONE":
			req.ToolChoice = "none"
		case "ANY":
			req.ToolChoice = "required"
			if len(fc.AllowedFunctionNames) == 1 {
				req.ToolChoice = "tool:" + fc.AllowedFunctionNames[0]
			}
		default:
			return Request{}, fmt.Errorf("generateContent request: functionCallingConfig.mode %q is unknown", fc.Mode)
		}
	}
	for _, t := range b.Tools {
		for _, d := range t.FunctionDeclarations {
			req.Tools = append(req.Tools, d.Name)
		}
	}
	if b.SystemInstruction != nil {
		text, _, _ := b.SystemInstruction.read()
		req.Messages = append(req.Messages, Message{Role: "system", Text: text})
	}
	for i, c := range b.Contents {
		text, calls, results := c.read()
		switch c.Role {
		case "model":
			req.Messages = append(req.Messages, Message{Role: "assistant", Text: text, ToolCalls: calls})
		case "user", "", "function":
			req.Messages = append(req.Messages, results...)
			if text != "" || len(results) == 0 {
				req.Messages = append(req.Messages, Message{Role: "user", Text: text})
			}
		default:
			return Request{}, fmt.Errorf("generateContent request: contents[%d]: unknown role %q", i, c.Role)
		}
	}
	return req, nil
}

// gmContent is a Content as the server reads it.
type gmContent struct {
	Role  string `json:"role"`
	Parts []struct {
		Text         string `json:"text"`
		Thought      bool   `json:"thought"`
		FunctionCall *struct {
			ID   string          `json:"id"`
			Name string          `json:"name"`
			Args json.RawMessage `json:"args"`
		} `json:"functionCall"`
		FunctionResponse *struct {
			ID       string          `json:"id"`
			Name     string          `json:"name"`
			Response json.RawMessage `json:"response"`
		} `json:"functionResponse"`
	} `json:"parts"`
}

// read is c's text parts (thoughts left out) joined with newlines, its
// function calls, and its function responses as tool messages (a
// response's text: its "output" or "content" when a string, else its
// JSON).
func (c gmContent) read() (string, []ToolCall, []Message) {
	var texts []string
	var calls []ToolCall
	var results []Message
	for _, p := range c.Parts {
		switch {
		case p.FunctionCall != nil:
			args := string(p.FunctionCall.Args)
			if args == "" || args == "null" {
				args = "{}"
			}
			calls = append(calls, ToolCall{ID: cmp.Or(p.FunctionCall.ID, p.FunctionCall.Name), Name: p.FunctionCall.Name, Arguments: args})
		case p.FunctionResponse != nil:
			fr := p.FunctionResponse
			results = append(results, Message{Role: "tool", Text: responseText(fr.Response), ToolCallID: cmp.Or(fr.ID, fr.Name)})
		case p.Text != "" && !p.Thought:
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), calls, results
}

// responseText is a function response's text: the string under output,
// content or result, else the response's JSON.
func responseText(raw json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) == nil {
		for _, k := range []string{"output", "content", "result"} {
			var s string
			if json.Unmarshal(m[k], &s) == nil && s != "" {
				return s
			}
		}
	}
	return string(raw)
}

// Wire shapes of Gemini's answers.
type (
	gmFunctionCall struct {
		ID   string          `json:"id,omitempty"`
		Name string          `json:"name"`
		Args json.RawMessage `json:"args"`
	}
	gmPart struct {
		Text         *string         `json:"text,omitempty"`
		Thought      bool            `json:"thought,omitempty"`
		FunctionCall *gmFunctionCall `json:"functionCall,omitempty"`
	}
	gmCandidateContent struct {
		Role  string   `json:"role"`
		Parts []gmPart `json:"parts"`
	}
	gmCandidate struct {
		Content      gmCandidateContent `json:"content"`
		FinishReason string             `json:"finishReason,omitempty"`
		Index        int                `json:"index"`
	}
	gmUsage struct {
		PromptTokenCount        int64 `json:"promptTokenCount"`
		CandidatesTokenCount    int64 `json:"candidatesTokenCount,omitempty"`
		CachedContentTokenCount int64 `json:"cachedContentTokenCount,omitempty"`
		ThoughtsTokenCount      int64 `json:"thoughtsTokenCount,omitempty"`
		TotalTokenCount         int64 `json:"totalTokenCount"`
	}
	gmResponse struct {
		Candidates    []gmCandidate `json:"candidates"`
		UsageMetadata *gmUsage      `json:"usageMetadata,omitempty"`
		ModelVersion  string        `json:"modelVersion"`
		ResponseID    string        `json:"responseId"`
	}
)

// geminiUsage is the usage a Gemini reply reports: the prompt (cached
// tokens included), the candidates', the thoughts' (Reply.Usage.Thoughts,
// within maxOutputTokens with the candidates' unless the reply ignores
// it) and their total.
func (p plan) geminiUsage(req Request, r Reply) *gmUsage {
	if !p.report {
		return nil
	}
	thoughts := p.usage.Thoughts
	if req.MaxTokens > 0 && !r.IgnoreMaxTokens {
		thoughts = min(thoughts, max(0, req.MaxTokens-(p.usage.Completion-r.OverReport)))
	}
	return &gmUsage{PromptTokenCount: p.usage.Prompt, CandidatesTokenCount: p.usage.Completion,
		CachedContentTokenCount: p.usage.Cached, ThoughtsTokenCount: thoughts,
		TotalTokenCount: p.usage.Prompt + p.usage.Completion + thoughts}
}

// finishGemini is Gemini's finishReason for p (a function call ends with
// STOP, as Gemini's do).
func (p plan) finishGemini() string {
	if p.truncated {
		return "MAX_TOKENS"
	}
	return "STOP"
}

func (c plannedCall) gemini() gmFunctionCall {
	return gmFunctionCall{ID: c.ID, Name: c.Name, Args: *toolInput(c.Arguments)}
}

func (s *Server) serveGemini(w http.ResponseWriter, ctx context.Context, req Request, reply Reply, p plan, id string) {
	pace := &pacer{ctx: ctx, reply: reply}
	base := gmResponse{ModelVersion: req.Model, ResponseID: id}
	if !req.Stream {
		if err := pace.waitAll(p.sent()); err != nil {
			return
		}
		parts := []gmPart{}
		if len(p.content) > 0 || len(p.calls) == 0 {
			parts = append(parts, gmPart{Text: ptr(join(p.content))})
		}
		for _, c := range p.calls {
			fc := c.gemini()
			parts = append(parts, gmPart{FunctionCall: &fc})
		}
		base.Candidates = []gmCandidate{{Content: gmCandidateContent{Role: "model", Parts: parts}, FinishReason: p.finishGemini()}}
		base.UsageMetadata = p.geminiUsage(req, reply)
		writeJSON(w, http.StatusOK, base)
		return
	}
	out := newSSE(w)
	// Every chunk but the last carries the prompt's count alone, as
	// Gemini's do; the last the whole usage.
	running := &gmUsage{PromptTokenCount: p.usage.Prompt, TotalTokenCount: p.usage.Prompt}
	if !p.report {
		running = nil
	}
	chunk := func(parts []gmPart, finish string, u *gmUsage) {
		c := base
		c.Candidates = []gmCandidate{{Content: gmCandidateContent{Role: "model", Parts: parts}, FinishReason: finish}}
		c.UsageMetadata = u
		b, _ := json.Marshal(c)
		out.event("", b)
	}
	tick := func() bool { return pace.tick(out) }
	for _, t := range p.content {
		if !tick() {
			return
		}
		chunk([]gmPart{{Text: ptr(t)}}, "", running)
	}
	for _, c := range p.calls {
		// Gemini sends a function call whole: the tokens pass, then the
		// call.
		for range 1 + len(c.args) {
			if !tick() {
				return
			}
		}
		fc := c.gemini()
		chunk([]gmPart{{FunctionCall: &fc}}, "", running)
	}
	chunk([]gmPart{{Text: ptr("")}}, p.finishGemini(), p.geminiUsage(req, reply))
}

// serveGeminiCount answers countTokens: a quarter of the body's bytes,
// rounded up (the prompt count a reply would report).
func serveGeminiCount(w http.ResponseWriter, body []byte) {
	var b map[string]json.RawMessage
	if err := json.Unmarshal(body, &b); err != nil || b == nil {
		writeError(w, "gemini", http.StatusBadRequest, fmt.Sprintf("countTokens request is not a JSON object: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"totalTokens": int64(len(body)+3) / 4})
}

// geminiStatus is the google.rpc status of an HTTP status.
func geminiStatus(code int) string {
	switch code {
	case http.StatusBadRequest:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	}
	return "INTERNAL"
}
