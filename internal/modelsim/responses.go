package modelsim

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// This file speaks OpenAI's Responses API (POST /v1/responses): it reads
// a request's input items into the script's conversation and renders a
// reply as output items (a reasoning item, a message, function or custom
// tool calls), whole or as the API's stream of events.

// ParseResponses reads a Responses request body. instructions become a
// system message; one model turn's items (reasoning, an assistant
// message, tool calls) become one assistant message with its tool calls,
// as a chat completion's; each tool call output a tool message.
func ParseResponses(body []byte) (Request, error) {
	var b struct {
		Model        string          `json:"model"`
		Instructions string          `json:"instructions"`
		Input        json.RawMessage `json:"input"`
		Tools        []struct {
			Type  string `json:"type"`
			Name  string `json:"name"`
			Tools []struct {
				Type string `json:"type"`
				Name string `json:"name"`
			} `json:"tools"`
		} `json:"tools"`
		Stream             bool            `json:"stream"`
		MaxOutputTokens    *int64          `json:"max_output_tokens"`
		ToolChoice         json.RawMessage `json:"tool_choice"`
		Include            []string        `json:"include"`
		PreviousResponseID string          `json:"previous_response_id"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return Request{}, fmt.Errorf("responses request: %w", err)
	}
	if b.Model == "" {
		return Request{}, errors.New("responses request: model is required")
	}
	if b.PreviousResponseID != "" {
		return Request{}, fmt.Errorf("responses request: previous response %q not found (modelsim stores no responses)", b.PreviousResponseID)
	}
	req := Request{API: "responses", Model: b.Model, Stream: b.Stream, IncludeUsage: true, BodyBytes: len(body),
		EncryptedReasoning: slices.Contains(b.Include, "reasoning.encrypted_content")}
	if b.MaxOutputTokens != nil {
		if *b.MaxOutputTokens < 1 {
			return Request{}, fmt.Errorf("responses request: max_output_tokens %d is below 1", *b.MaxOutputTokens)
		}
		req.MaxTokens = *b.MaxOutputTokens
	}
	choice, err := responsesToolChoice(b.ToolChoice)
	if err != nil {
		return Request{}, fmt.Errorf("responses request: %w", err)
	}
	req.ToolChoice = choice
	for _, t := range b.Tools {
		switch t.Type {
		case "function":
			req.Tools = append(req.Tools, t.Name)
		case "custom":
			req.Tools = append(req.Tools, t.Name)
			req.CustomTools = append(req.CustomTools, t.Name)
		case "namespace": // a group of function and custom tools
			for _, nt := range t.Tools {
				req.Tools = append(req.Tools, nt.Name)
				if nt.Type == "custom" {
					req.CustomTools = append(req.CustomTools, nt.Name)
				}
			}
		default: // local_shell and the provider's tools go by their type
			req.Tools = append(req.Tools, t.Type)
		}
	}
	if b.Instructions != "" {
		req.Messages = append(req.Messages, Message{Role: "system", Text: b.Instructions})
	}
	msgs, err := responsesInput(b.Input)
	if err != nil {
		return Request{}, fmt.Errorf("responses request: %w", err)
	}
	if len(msgs) == 0 {
		return Request{}, errors.New("responses request: input is empty")
	}
	req.Messages = append(req.Messages, msgs...)
	return req, nil
}

// responsesInput reads input: a string (one user message) or a list of
// items.
func responsesInput(raw json.RawMessage) ([]Message, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, nil
		}
		return []Message{{Role: "user", Text: s}}, nil
	}
	var items []struct {
		Type      string          `json:"type"`
		ID        string          `json:"id"`
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Arguments string          `json:"arguments"`
		Input     string          `json:"input"`
		Action    json.RawMessage `json:"action"`
		Output    json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("input is neither a string nor a list of items: %w", err)
	}
	var out []Message
	// turn is the assistant message being gathered from one turn's items.
	turn := -1
	assistant := func() *Message {
		if turn < 0 {
			out = append(out, Message{Role: "assistant"})
			turn = len(out) - 1
		}
		return &out[turn]
	}
	for i, it := range items {
		typ := it.Type
		if typ == "" {
			typ = "message"
		}
		switch typ {
		case "message":
			text, err := responsesText(it.Content)
			if err != nil {
				return nil, fmt.Errorf("input[%d]: %w", i, err)
			}
			role := it.Role
			switch role {
			case "assistant":
				m := assistant()
				m.Text += text
				continue
			case "developer":
				role = "system"
			case "system", "user":
			default:
				return nil, fmt.Errorf("input[%d]: unknown role %q", i, it.Role)
			}
			out = append(out, Message{Role: role, Text: text})
		case "reasoning":
			assistant()
			continue
		case "function_call":
			m := assistant()
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: it.CallID, Name: it.Name, Arguments: it.Arguments})
			continue
		case "custom_tool_call":
			m := assistant()
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: it.CallID, Name: it.Name, Arguments: it.Input})
			continue
		case "local_shell_call":
			m := assistant()
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: cmp.Or(it.CallID, it.ID), Name: "local_shell", Arguments: string(it.Action)})
			continue
		case "function_call_output", "custom_tool_call_output", "local_shell_call_output":
			text, err := responsesText(it.Output)
			if err != nil {
				return nil, fmt.Errorf("input[%d]: output: %w", i, err)
			}
			out = append(out, Message{Role: "tool", Text: text, ToolCallID: cmp.Or(it.CallID, it.ID)})
		default:
			// Items of the provider's own tools and references: not part of
			// the conversation the script reads.
		}
		turn = -1
	}
	return out, nil
}

// responsesText is a content or output field: a string, null, or parts
// whose text parts are joined with newlines.
func responsesText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content is neither a string nor a list of parts: %w", err)
	}
	var texts []string
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// responsesToolChoice reads the Responses API's tool_choice: "auto",
// "none", "required", {"type": "function" | "custom", "name"},
// {"type": "allowed_tools", "mode"}, or a tool type ({"type":
// "local_shell"}: "tool:local_shell").
func responsesToolChoice(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || raw[0] != '{' {
		return toolChoice(raw)
	}
	var o struct {
		Type string `json:"type"`
		Name string `json:"name"`
		Mode string `json:"mode"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("tool_choice: %w", err)
	}
	switch o.Type {
	case "function", "custom":
		return "tool:" + o.Name, nil
	case "allowed_tools":
		return toolChoice(json.RawMessage(fmt.Sprintf("%q", cmp.Or(o.Mode, "auto"))))
	case "":
		return "", errors.New("tool_choice has no type")
	}
	return "tool:" + o.Type, nil
}

// rsUsage is the Responses API's usage object.
type rsUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

func (p plan) responsesUsage() *rsUsage {
	if !p.report {
		return nil
	}
	u := &rsUsage{InputTokens: p.usage.Prompt, OutputTokens: p.usage.Completion, TotalTokens: p.usage.Prompt + p.usage.Completion}
	u.InputTokensDetails.CachedTokens = p.usage.Cached
	u.OutputTokensDetails.ReasoningTokens = min(int64(len(p.reasoning)), max(p.usage.Completion, 0))
	return u
}

// rsResponse is a response object (the answer, and the response events
// carry).
type rsResponse struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"`
	CreatedAt         int64            `json:"created_at"`
	Status            string           `json:"status"`
	Error             any              `json:"error"`
	IncompleteDetails any              `json:"incomplete_details"`
	Model             string           `json:"model"`
	Output            []map[string]any `json:"output"`
	ParallelToolCalls bool             `json:"parallel_tool_calls"`
	Store             bool             `json:"store"`
	MaxOutputTokens   *int64           `json:"max_output_tokens"`
	Usage             *rsUsage         `json:"usage"`
}

// responsesReply is what a reply amounts to in the Responses API.
type responsesReply struct {
	id        string
	reasoning map[string]any   // nil: none
	message   map[string]any   // nil: none
	calls     []map[string]any // whole
	custom    []bool           // calls[k] is a custom tool call
}

func (s *Server) responsesItems(req Request, p plan, id string) responsesReply {
	r := responsesReply{id: id}
	if len(p.reasoning) > 0 {
		text := join(p.reasoning)
		r.reasoning = map[string]any{"type": "reasoning", "id": "rs_" + id,
			"summary": []map[string]any{{"type": "summary_text", "text": text}}}
		if req.EncryptedReasoning {
			r.reasoning["encrypted_content"] = base64.StdEncoding.EncodeToString([]byte("modelsim-reasoning:" + text))
		}
	}
	if len(p.content) > 0 || len(p.calls) == 0 {
		r.message = map[string]any{"type": "message", "id": "msg_" + id, "status": "completed", "role": "assistant",
			"content": []map[string]any{{"type": "output_text", "text": join(p.content), "annotations": []any{}}}}
	}
	for k, c := range p.calls {
		custom := slices.Contains(req.CustomTools, c.Name)
		item := map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%s_%d", id, k), "call_id": c.ID,
			"name": c.Name, "arguments": c.Arguments, "status": "completed"}
		if custom {
			item = map[string]any{"type": "custom_tool_call", "id": fmt.Sprintf("ctc_%s_%d", id, k), "call_id": c.ID,
				"name": c.Name, "input": c.Arguments, "status": "completed"}
		}
		r.calls = append(r.calls, item)
		r.custom = append(r.custom, custom)
	}
	return r
}

func (r responsesReply) output() []map[string]any {
	out := []map[string]any{}
	if r.reasoning != nil {
		out = append(out, r.reasoning)
	}
	if r.message != nil {
		out = append(out, r.message)
	}
	return append(out, r.calls...)
}

func (s *Server) serveResponses(w http.ResponseWriter, ctx context.Context, req Request, reply Reply, p plan, id string) {
	pace := &pacer{ctx: ctx, reply: reply}
	items := s.responsesItems(req, p, id)
	response := func(status string, output []map[string]any, usage *rsUsage) rsResponse {
		r := rsResponse{ID: "resp_" + id, Object: "response", CreatedAt: s.opts.Created, Status: status, Model: req.Model,
			Output: output, ParallelToolCalls: true, Usage: usage}
		if req.MaxTokens > 0 {
			r.MaxOutputTokens = ptr(req.MaxTokens)
		}
		if status == "incomplete" {
			r.IncompleteDetails = map[string]string{"reason": "max_output_tokens"}
		}
		return r
	}
	status := "completed"
	if p.truncated {
		status = "incomplete"
	}
	if !req.Stream {
		if err := pace.waitAll(p.sent()); err != nil {
			return
		}
		writeJSON(w, http.StatusOK, response(status, items.output(), p.responsesUsage()))
		return
	}
	out := newSSE(w)
	seq := 0
	event := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		b, _ := json.Marshal(fields)
		out.event(typ, b)
	}
	tick := func() bool { return pace.tick(out) }
	event("response.created", map[string]any{"response": response("in_progress", []map[string]any{}, nil)})
	event("response.in_progress", map[string]any{"response": response("in_progress", []map[string]any{}, nil)})
	index := 0
	if it := items.reasoning; it != nil {
		itemID := it["id"]
		event("response.output_item.added", map[string]any{"output_index": index,
			"item": map[string]any{"type": "reasoning", "id": itemID, "summary": []any{}}})
		event("response.reasoning_summary_part.added", map[string]any{"item_id": itemID, "output_index": index, "summary_index": 0,
			"part": map[string]any{"type": "summary_text", "text": ""}})
		for _, t := range p.reasoning {
			if !tick() {
				return
			}
			event("response.reasoning_summary_text.delta", map[string]any{"item_id": itemID, "output_index": index, "summary_index": 0, "delta": t})
		}
		text := join(p.reasoning)
		event("response.reasoning_summary_text.done", map[string]any{"item_id": itemID, "output_index": index, "summary_index": 0, "text": text})
		event("response.reasoning_summary_part.done", map[string]any{"item_id": itemID, "output_index": index, "summary_index": 0,
			"part": map[string]any{"type": "summary_text", "text": text}})
		event("response.output_item.done", map[string]any{"output_index": index, "item": it})
		index++
	}
	if it := items.message; it != nil {
		itemID := it["id"]
		event("response.output_item.added", map[string]any{"output_index": index,
			"item": map[string]any{"type": "message", "id": itemID, "status": "in_progress", "role": "assistant", "content": []any{}}})
		event("response.content_part.added", map[string]any{"item_id": itemID, "output_index": index, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
		for _, t := range p.content {
			if !tick() {
				return
			}
			event("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": index, "content_index": 0,
				"delta": t, "logprobs": []any{}})
		}
		text := join(p.content)
		event("response.output_text.done", map[string]any{"item_id": itemID, "output_index": index, "content_index": 0,
			"text": text, "logprobs": []any{}})
		event("response.content_part.done", map[string]any{"item_id": itemID, "output_index": index, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}})
		event("response.output_item.done", map[string]any{"output_index": index, "item": it})
		index++
	}
	for k, c := range p.calls {
		if !tick() {
			return
		}
		whole := items.calls[k]
		itemID := whole["id"]
		added := map[string]any{}
		for key, v := range whole {
			added[key] = v
		}
		field, deltaEvent, doneEvent := "arguments", "response.function_call_arguments.delta", "response.function_call_arguments.done"
		if items.custom[k] {
			field, deltaEvent, doneEvent = "input", "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done"
		}
		added[field], added["status"] = "", "in_progress"
		event("response.output_item.added", map[string]any{"output_index": index, "item": added})
		for _, a := range c.args {
			if !tick() {
				return
			}
			event(deltaEvent, map[string]any{"item_id": itemID, "output_index": index, "delta": a})
		}
		event(doneEvent, map[string]any{"item_id": itemID, "output_index": index, field: c.Arguments})
		event("response.output_item.done", map[string]any{"output_index": index, "item": whole})
		index++
	}
	final := "response.completed"
	if p.truncated {
		final = "response.incomplete"
	}
	event(final, map[string]any{"response": response(status, items.output(), p.responsesUsage())})
}
