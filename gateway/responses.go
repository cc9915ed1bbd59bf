package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// This file reads and rewrites OpenAI's Responses API (POST
// /v1/responses, the API Codex CLI speaks): requests, answers and
// streams. Pure, like openai.go. The gateway holds no server-side state:
// a request must carry its whole conversation in input (what Codex sends
// with store false), previous_response_id and stored prompts are
// refused, and store is forced to false upstream.

// CallOpenAIResponses is the API name of a recorded Responses call.
const CallOpenAIResponses = "openai.responses"

var responsesAdapter = adapter{api: APIOpenAI, call: CallOpenAIResponses, parse: parseResponsesRequest,
	rewrite: func(r callRequest, rt route, n int64) ([]byte, error) {
		return rewriteResponses(r, rt.model.Upstream, n)
	},
	response:  parseResponsesResponse,
	assembler: func() assembler { return &responsesAssembler{} },
	endpoint:  func(rt route) string { return rt.responses }}

// unsupportedResponses are request fields the gateway refuses, with the
// reason: server-side state it cannot record or replay, or cost it
// cannot bound.
var unsupportedResponses = map[string]string{
	"previous_response_id": "the gateway keeps no stored responses (a trajectory must be whole to be replayed): send the whole conversation in input, with store false",
	"conversation":         "the gateway keeps no stored conversations (a trajectory must be whole to be replayed): send the whole conversation in input, with store false",
	"prompt":               "stored prompt templates live at the provider: their content can be neither bounded nor recorded",
}

// responsesToolTypes are the tool types an agent runs itself (and
// namespaces of function and custom tools): the
// provider's own tools (web_search, file_search, code_interpreter,
// image_generation, computer use, remote MCP) bill per use and are
// refused.
var responsesToolTypes = []string{"function", "custom", "local_shell"}

// responsesItemTypes are the input item types the gateway passes: the
// conversation's messages, reasoning (its encrypted_content counted as
// bytes like any text), the agent's own tool calls and their outputs.
// Items that refer to stored state (item_reference) or to the
// provider's own tools are refused.
var responsesItemTypes = []string{"message", "reasoning", "function_call", "function_call_output",
	"custom_tool_call", "custom_tool_call_output", "local_shell_call", "local_shell_call_output"}

// maxInputItems bounds a request's input items.
const maxInputItems = 1 << 16

// parseResponsesRequest reads a Responses request body.
func parseResponsesRequest(body []byte) (callRequest, error) {
	// Every Responses stream ends with its usage: nothing is withheld.
	r := callRequest{Choices: 1, IncludeUsage: true}
	if err := json.Unmarshal(body, &r.fields); err != nil {
		return r, fmt.Errorf("request body is not a JSON object: %w", err)
	}
	if r.fields == nil {
		return r, errors.New("request body is null, not a JSON object")
	}
	if err := jsonField(r.fields, "model", &r.Model); err != nil || r.Model == "" {
		return r, errors.Join(errors.New("model is required (a string)"), err)
	}
	if err := jsonField(r.fields, "stream", &r.Stream); err != nil {
		return r, err
	}
	for _, f := range slices.Sorted(maps.Keys(unsupportedResponses)) {
		if v, ok := r.fields[f]; ok && string(v) != "null" {
			return r, fmt.Errorf("%s is not supported by the gateway: %s", f, unsupportedResponses[f])
		}
	}
	var store, background bool
	if err := jsonField(r.fields, "store", &store); err != nil {
		return r, err
	}
	if err := jsonField(r.fields, "background", &background); err != nil {
		return r, err
	}
	if background {
		return r, errors.New("background is not supported by the gateway: a background response is kept at the provider and read later, outside the call the gateway meters")
	}
	var tier string
	if err := jsonField(r.fields, "service_tier", &tier); err != nil {
		return r, err
	}
	switch tier {
	case "", "auto", "default":
	default:
		return r, fmt.Errorf("service_tier %q is not supported by the gateway: prices are the standard tier's", tier)
	}
	var tools []struct {
		Type  string `json:"type"`
		Tools []struct {
			Type string `json:"type"`
		} `json:"tools"`
	}
	if err := jsonField(r.fields, "tools", &tools); err != nil {
		return r, err
	}
	for i, t := range tools {
		if t.Type == "namespace" {
			// A namespace groups the agent's own tools (Codex's sub-agent
			// functions).
			for j, nt := range t.Tools {
				if nt.Type != "function" && nt.Type != "custom" {
					return r, fmt.Errorf("tools[%d].tools[%d]: type %q is not supported by the gateway (a namespace may hold only function and custom tools, which the agent runs)", i, j, nt.Type)
				}
			}
			continue
		}
		if !slices.Contains(responsesToolTypes, t.Type) {
			return r, fmt.Errorf("tools[%d]: type %q is not supported by the gateway (only function, custom, local_shell and namespace tools, which the agent runs; the provider's own tools bill per use)", i, t.Type)
		}
	}
	var maxOut *int64
	if err := jsonField(r.fields, "max_output_tokens", &maxOut); err != nil {
		return r, err
	}
	if maxOut != nil {
		if *maxOut < 1 {
			return r, fmt.Errorf("max_output_tokens %d is below 1", *maxOut)
		}
		r.Requested = *maxOut
	}
	raw, ok := r.fields["input"]
	if !ok || string(raw) == "null" {
		return r, errors.New("input is required (the whole conversation: the gateway keeps no stored state)")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if text == "" {
			return r, errors.New("input is empty")
		}
		return r, nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Output  json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return r, fmt.Errorf("input is neither a string nor a list of items: %w", err)
	}
	if len(items) == 0 || len(items) > maxInputItems {
		return r, fmt.Errorf("input has %d items, not in [1, %d]", len(items), maxInputItems)
	}
	for i, it := range items {
		typ := it.Type
		if typ == "" && it.Role != "" {
			typ = "message"
		}
		if !slices.Contains(responsesItemTypes, typ) {
			return r, fmt.Errorf("input[%d]: item type %q is not supported by the gateway (only messages, reasoning, and the agent's own tool calls and their outputs: stored items and the provider's tools are not)", i, it.Type)
		}
		var parts json.RawMessage
		switch typ {
		case "message":
			parts = it.Content
		case "function_call_output", "custom_tool_call_output":
			parts = it.Output
		}
		n, err := responsesParts(parts)
		if err != nil {
			return r, fmt.Errorf("input[%d]: %w", i, err)
		}
		r.Images += n
	}
	return r, nil
}

// responsesParts checks content (a string or a list of parts) for part
// types whose tokens the gateway can bound and counts its images.
func responsesParts(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return 0, nil
	}
	var parts []struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, fmt.Errorf("content: %w", err)
	}
	var images int64
	for j, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "refusal", "text", "summary_text", "reasoning_text":
		case "input_image":
			images++
		default:
			return 0, fmt.Errorf("content[%d]: part type %q is not supported by the gateway (its tokens cannot be bounded)", j, p.Type)
		}
	}
	return images, nil
}

// rewriteResponses is the body sent to the provider: the client's, with
// the upstream model name, max_output_tokens set to maxOut (it bounds
// reasoning and visible output together) and store false (the provider
// keeps nothing the trajectory lacks).
func rewriteResponses(r callRequest, upstream string, maxOut int64) ([]byte, error) {
	f := r.edit()
	f.set("model", upstream)
	f.set("max_output_tokens", maxOut)
	f.set("store", false)
	return marshalFields(f)
}

// responsesUsage is the Responses API's usage object.
type responsesUsage struct {
	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

// usage counts cached tokens as cached input, and reasoning tokens as
// output: output_tokens includes them; a server that reports more
// reasoning tokens than output tokens is taken at its reasoning count.
func (u responsesUsage) usage() (Usage, error) {
	if u.InputTokens == nil || u.OutputTokens == nil {
		return Usage{}, errors.New("usage lacks input_tokens or output_tokens")
	}
	out := Usage{Input: *u.InputTokens, Output: *u.OutputTokens}
	if u.InputTokensDetails != nil {
		out.CachedInput = u.InputTokensDetails.CachedTokens
	}
	if d := u.OutputTokensDetails; d != nil {
		if d.ReasoningTokens < 0 {
			return Usage{}, fmt.Errorf("usage has negative reasoning tokens (%d)", d.ReasoningTokens)
		}
		out.Output = max(out.Output, d.ReasoningTokens)
	}
	return valid(out)
}

// parseResponsesResponse reads a non-streaming answer's usage.
func parseResponsesResponse(body []byte) (Usage, bool, error) {
	return answerUsage[responsesUsage](body)
}

// Bounds on the parts of one output item a stream may build.
const maxItemParts = 64

// responsesAssembler rebuilds a response from its stream of events: the
// final event's response (response.completed, .incomplete or .failed)
// when it came, with its output filled from the items streamed when it
// has none; else the response as created, with the items streamed so
// far.
type responsesAssembler struct {
	created  map[string]json.RawMessage
	final    map[string]json.RawMessage
	items    []*responsesItemAcc
	usage    *Usage
	usageErr error
	errEvent json.RawMessage
	done     bool
}

type responsesItemAcc struct {
	item    map[string]json.RawMessage // as added, then as done
	done    bool
	parts   []*responsesPartAcc // message content by content_index
	summary []*strings.Builder  // reasoning summary by summary_index
	text    []*strings.Builder  // reasoning text by content_index
	args    strings.Builder     // function_call arguments, custom_tool_call input
}

type responsesPartAcc struct {
	typ  string
	text strings.Builder
}

// Event takes the data of one event (its type is in the data).
func (a *responsesAssembler) Event(data []byte) (chunkInfo, error) {
	// Objects are kept raw and read only by the events that use them:
	// most events are deltas.
	var e struct {
		Type         string          `json:"type"`
		Response     json.RawMessage `json:"response"`
		OutputIndex  int             `json:"output_index"`
		ContentIndex int             `json:"content_index"`
		SummaryIndex int             `json:"summary_index"`
		Item         json.RawMessage `json:"item"`
		Part         json.RawMessage `json:"part"`
		Delta        string          `json:"delta"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return chunkInfo{}, fmt.Errorf("stream event: %w", err)
	}
	object := func(raw json.RawMessage) (map[string]json.RawMessage, error) {
		var m map[string]json.RawMessage
		if len(raw) == 0 {
			return nil, nil
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Type, err)
		}
		return m, nil
	}
	item := func() (*responsesItemAcc, error) { return slot(&a.items, e.OutputIndex, maxBlocks, "output item") }
	var info chunkInfo
	switch e.Type {
	case "response.created":
		r, err := object(e.Response)
		if err != nil {
			return info, err
		}
		a.created = r
	case "response.completed", "response.incomplete", "response.failed":
		a.done = true
		info.Done = true
		r, err := object(e.Response)
		if err != nil {
			return info, err
		}
		a.final = r
		var u struct {
			Usage *responsesUsage `json:"usage"`
		}
		if raw, ok := r["usage"]; ok {
			if err := json.Unmarshal(raw, &u.Usage); err != nil {
				a.usageErr = fmt.Errorf("%s usage: %w", e.Type, err)
				return info, a.usageErr
			}
		}
		if u.Usage != nil {
			usage, err := u.Usage.usage()
			a.usage, a.usageErr = &usage, err
		}
	case "response.output_item.added", "response.output_item.done":
		it, err := item()
		if err != nil {
			return info, err
		}
		m, err := object(e.Item)
		if err != nil {
			return info, err
		}
		if m != nil {
			it.item = m
		}
		it.done = it.done || e.Type == "response.output_item.done"
		info.Token = e.Type == "response.output_item.done"
	case "response.content_part.added":
		it, err := item()
		if err != nil {
			return info, err
		}
		p, err := slot(&it.parts, e.ContentIndex, maxItemParts, "content part")
		if err != nil {
			return info, err
		}
		var part struct {
			Type string `json:"type"`
		}
		if len(e.Part) > 0 {
			if err := json.Unmarshal(e.Part, &part); err != nil {
				return info, fmt.Errorf("%s: %w", e.Type, err)
			}
		}
		p.typ = cmpOr(p.typ, part.Type)
	case "response.output_text.delta", "response.refusal.delta":
		it, err := item()
		if err != nil {
			return info, err
		}
		p, err := slot(&it.parts, e.ContentIndex, maxItemParts, "content part")
		if err != nil {
			return info, err
		}
		if p.typ == "" {
			p.typ = "output_text"
			if e.Type == "response.refusal.delta" {
				p.typ = "refusal"
			}
		}
		p.text.WriteString(e.Delta)
		info.Token = e.Delta != ""
	case "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		it, err := item()
		if err != nil {
			return info, err
		}
		it.args.WriteString(e.Delta)
		info.Token = e.Delta != ""
	case "response.reasoning_summary_text.delta", "response.reasoning_text.delta":
		it, err := item()
		if err != nil {
			return info, err
		}
		list, i := &it.summary, e.SummaryIndex
		if e.Type == "response.reasoning_text.delta" {
			list, i = &it.text, e.ContentIndex
		}
		b, err := slot(list, i, maxItemParts, "reasoning part")
		if err != nil {
			return info, err
		}
		b.WriteString(e.Delta)
		info.Token = e.Delta != ""
	case "error":
		a.errEvent = bytes.Clone(data)
	}
	return info, nil
}

// Usage is the final event's usage; a stream without one has none.
func (a *responsesAssembler) Usage() (Usage, bool, error) {
	if a.usage == nil {
		return Usage{}, false, a.usageErr
	}
	return *a.usage, a.usageErr == nil, a.usageErr
}

// Complete says whether the stream ended with its final event.
func (a *responsesAssembler) Complete() bool { return a.done }

// Response is the response the stream amounts to.
func (a *responsesAssembler) Response() []byte {
	out := map[string]json.RawMessage{}
	src := a.final
	if src == nil {
		src = a.created
	}
	for k, v := range src {
		out[k] = v
	}
	var output []json.RawMessage
	if raw, ok := out["output"]; ok {
		_ = json.Unmarshal(raw, &output)
	}
	if len(output) == 0 && len(a.items) > 0 {
		output = make([]json.RawMessage, 0, len(a.items))
		for _, it := range a.items {
			output = append(output, it.assemble())
		}
		b, _ := json.Marshal(output)
		out["output"] = b
	}
	if a.errEvent != nil {
		out["error"] = a.errEvent
	}
	b, _ := json.Marshal(out)
	return b
}

// assemble is the item: as done, or as added with its deltas.
func (it *responsesItemAcc) assemble() json.RawMessage {
	c := map[string]json.RawMessage{}
	for k, v := range it.item {
		c[k] = v
	}
	if !it.done {
		put := func(k string, v any) {
			raw, _ := json.Marshal(v)
			c[k] = raw
		}
		var typ string
		_ = json.Unmarshal(c["type"], &typ)
		switch typ {
		case "message":
			parts := make([]map[string]any, 0, len(it.parts))
			for _, p := range it.parts {
				part := map[string]any{"type": cmpOr(p.typ, "output_text")}
				if p.typ == "refusal" {
					part["refusal"] = p.text.String()
				} else {
					part["text"], part["annotations"] = p.text.String(), []any{}
				}
				parts = append(parts, part)
			}
			put("content", parts)
		case "function_call":
			put("arguments", it.args.String())
		case "custom_tool_call":
			put("input", it.args.String())
		case "reasoning":
			summary := make([]map[string]string, 0, len(it.summary))
			for _, s := range it.summary {
				summary = append(summary, map[string]string{"type": "summary_text", "text": s.String()})
			}
			put("summary", summary)
			if len(it.text) > 0 {
				content := make([]map[string]string, 0, len(it.text))
				for _, s := range it.text {
					content = append(content, map[string]string{"type": "reasoning_text", "text": s.String()})
				}
				put("content", content)
			}
		}
		if typ != "" {
			put("status", "incomplete")
		}
	}
	b, _ := json.Marshal(c)
	return b
}

// responsesTexts are the output_text parts of an answer's messages
// joined (HAL's outputs).
func responsesTexts(body []byte) []string {
	var r struct {
		Output []struct {
			Type    string `json:"type"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	if json.Unmarshal(body, &r) != nil {
		return []string{}
	}
	var texts []string
	for _, o := range r.Output {
		if o.Type != "message" {
			continue
		}
		for _, c := range o.Content {
			if c.Type == "output_text" {
				texts = append(texts, c.Text)
			}
		}
	}
	return []string{strings.Join(texts, "")}
}
