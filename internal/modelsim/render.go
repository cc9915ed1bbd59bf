package modelsim

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
)

// replyID derives a reply's ID from the request, so the same request gets
// the same ID.
func replyID(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:12])
}

// Wire shapes of OpenAI's chat completions.
type (
	oaFunction struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	oaToolCall struct {
		Index    *int       `json:"index,omitempty"`
		ID       string     `json:"id,omitempty"`
		Type     string     `json:"type,omitempty"`
		Function oaFunction `json:"function"`
	}
	oaMessage struct {
		Role      string       `json:"role,omitempty"`
		Content   *string      `json:"content,omitempty"`
		ToolCalls []oaToolCall `json:"tool_calls,omitempty"`
	}
	oaTop struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
		Bytes   []int   `json:"bytes"`
	}
	oaTokenLogprob struct {
		oaTop
		TopLogprobs []oaTop `json:"top_logprobs"`
	}
	oaLogprobs struct {
		Content []oaTokenLogprob `json:"content"`
	}
	oaChoice struct {
		Index        int         `json:"index"`
		Message      *oaMessage  `json:"message,omitempty"`
		Delta        *oaMessage  `json:"delta,omitempty"`
		Logprobs     *oaLogprobs `json:"logprobs"`
		FinishReason *string     `json:"finish_reason"`
	}
	oaUsage struct {
		PromptTokens        int64 `json:"prompt_tokens"`
		CompletionTokens    int64 `json:"completion_tokens"`
		TotalTokens         int64 `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	oaResponse struct {
		ID                string     `json:"id"`
		Object            string     `json:"object"`
		Created           int64      `json:"created"`
		Model             string     `json:"model"`
		SystemFingerprint string     `json:"system_fingerprint"`
		Choices           []oaChoice `json:"choices"`
		// Usage is a pointer to a pointer so that a stream's chunks can
		// carry "usage": null (include_usage) or no usage key at all.
		Usage **oaUsage `json:"usage,omitempty"`
	}
)

func (p plan) openAIUsage() *oaUsage {
	u := &oaUsage{PromptTokens: p.usage.Prompt, CompletionTokens: p.usage.Completion,
		TotalTokens: p.usage.Prompt + p.usage.Completion}
	u.PromptTokensDetails.CachedTokens = p.usage.Cached
	return u
}

func logprobEntry(token string, lp float64) oaTop {
	b := make([]int, len(token))
	for i := range len(token) {
		b[i] = int(token[i])
	}
	return oaTop{Token: token, Logprob: lp, Bytes: b}
}

func (r Reply) openAILogprob(i int, token string, top int) oaTokenLogprob {
	e := oaTokenLogprob{oaTop: logprobEntry(token, r.tokenLogprob(i, token)), TopLogprobs: []oaTop{}}
	for _, a := range r.topLogprobs(i, token, top) {
		e.TopLogprobs = append(e.TopLogprobs, logprobEntry(a.Token, a.Logprob))
	}
	return e
}

func ptr[T any](v T) *T { return &v }

func (s *Server) serveOpenAI(w http.ResponseWriter, ctx context.Context, req Request, reply Reply, p plan, id string) {
	base := oaResponse{ID: "chatcmpl-" + id, Object: "chat.completion", Created: s.opts.Created, Model: req.Model,
		SystemFingerprint: "modelsim"}
	pace := &pacer{ctx: ctx, reply: reply}
	if !req.Stream {
		if err := pace.waitAll(p.sent()); err != nil {
			return
		}
		var content *string
		if len(p.content) > 0 || len(p.calls) == 0 {
			content = ptr(join(p.content))
		}
		msg := &oaMessage{Role: "assistant", Content: content}
		for _, c := range p.calls {
			msg.ToolCalls = append(msg.ToolCalls, oaToolCall{ID: c.ID, Type: "function", Function: oaFunction{Name: c.Name, Arguments: c.Arguments}})
		}
		ch := oaChoice{Message: msg, FinishReason: ptr(p.finishOpenAI())}
		if req.Logprobs && !reply.NoLogprobs {
			ch.Logprobs = &oaLogprobs{Content: []oaTokenLogprob{}}
			for i, t := range p.content {
				ch.Logprobs.Content = append(ch.Logprobs.Content, reply.openAILogprob(i, t, req.TopLogprobs))
			}
		}
		base.Choices = []oaChoice{ch}
		if p.report {
			u := p.openAIUsage()
			base.Usage = &u
		}
		writeJSON(w, http.StatusOK, base)
		return
	}
	base.Object = "chat.completion.chunk"
	out := newSSE(w)
	chunk := func(ch oaChoice) {
		c := base
		c.Choices = []oaChoice{ch}
		if req.IncludeUsage {
			var null *oaUsage
			c.Usage = &null
		}
		b, _ := json.Marshal(c)
		out.event("", b)
	}
	chunk(oaChoice{Delta: &oaMessage{Role: "assistant", Content: ptr("")}})
	tick := func() bool { return pace.tick(out) }
	for i, t := range p.content {
		if !tick() {
			return
		}
		ch := oaChoice{Delta: &oaMessage{Content: ptr(t)}}
		if req.Logprobs && !reply.NoLogprobs {
			ch.Logprobs = &oaLogprobs{Content: []oaTokenLogprob{reply.openAILogprob(i, t, req.TopLogprobs)}}
		}
		chunk(ch)
	}
	for k, c := range p.calls {
		if !tick() {
			return
		}
		chunk(oaChoice{Delta: &oaMessage{ToolCalls: []oaToolCall{{Index: ptr(k), ID: c.ID, Type: "function",
			Function: oaFunction{Name: c.Name}}}}})
		for _, a := range c.args {
			if !tick() {
				return
			}
			chunk(oaChoice{Delta: &oaMessage{ToolCalls: []oaToolCall{{Index: ptr(k), Function: oaFunction{Arguments: a}}}}})
		}
	}
	chunk(oaChoice{Delta: &oaMessage{}, FinishReason: ptr(p.finishOpenAI())})
	if req.IncludeUsage && p.report {
		c := base
		c.Choices = []oaChoice{}
		u := p.openAIUsage()
		c.Usage = &u
		b, _ := json.Marshal(c)
		out.event("", b)
	}
	out.event("", []byte("[DONE]"))
}

// Wire shapes of Anthropic's Messages API.
type (
	anBlock struct {
		Type      string           `json:"type"`
		Text      *string          `json:"text,omitempty"`
		Thinking  *string          `json:"thinking,omitempty"`
		Signature *string          `json:"signature,omitempty"`
		Data      string           `json:"data,omitempty"`
		ID        string           `json:"id,omitempty"`
		Name      string           `json:"name,omitempty"`
		Input     *json.RawMessage `json:"input,omitempty"`
		ToolUseID string           `json:"tool_use_id,omitempty"`
		Content   any              `json:"content,omitempty"`
	}
	anCacheCreation struct {
		Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	}
	anServerToolUse struct {
		WebSearchRequests int64 `json:"web_search_requests"`
	}
	anUsage struct {
		InputTokens              int64            `json:"input_tokens"`
		CacheCreationInputTokens int64            `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int64            `json:"cache_read_input_tokens"`
		CacheCreation            anCacheCreation  `json:"cache_creation"`
		OutputTokens             int64            `json:"output_tokens"`
		ServerToolUse            *anServerToolUse `json:"server_tool_use,omitempty"`
		ServiceTier              string           `json:"service_tier"`
	}
	anMessage struct {
		ID           string    `json:"id"`
		Type         string    `json:"type"`
		Role         string    `json:"role"`
		Model        string    `json:"model"`
		Content      []anBlock `json:"content"`
		StopReason   *string   `json:"stop_reason"`
		StopSequence *string   `json:"stop_sequence"`
		Usage        *anUsage  `json:"usage,omitempty"`
	}
)

func (p plan) anthropicUsage(output int64) *anUsage {
	if !p.report {
		return nil
	}
	u := &anUsage{InputTokens: p.usage.Prompt - p.usage.Cached - p.usage.CacheWrite,
		CacheCreationInputTokens: p.usage.CacheWrite, CacheReadInputTokens: p.usage.Cached, OutputTokens: output,
		CacheCreation: anCacheCreation{Ephemeral5m: p.usage.CacheWrite - p.usage.CacheWrite1h, Ephemeral1h: p.usage.CacheWrite1h},
		ServiceTier:   "standard"}
	if p.searches > 0 {
		u.ServerToolUse = &anServerToolUse{WebSearchRequests: int64(p.searches)}
	}
	return u
}

// signature is a thinking block's signature: derived from its text, as
// opaque as the provider's.
func signature(thinking string) string {
	sum := sha256.Sum256([]byte("modelsim thinking " + thinking))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// search is the k-th provider-side web search of a reply: the
// server_tool_use block and its result.
func search(id string, k int) (use, result anBlock) {
	sid := fmt.Sprintf("srvtoolu_%s_%d", id[:8], k)
	in := json.RawMessage(fmt.Sprintf(`{"query":"modelsim search %d"}`, k+1))
	use = anBlock{Type: "server_tool_use", ID: sid, Name: "web_search", Input: &in}
	result = anBlock{Type: "web_search_tool_result", ToolUseID: sid, Content: []map[string]any{{"type": "web_search_result",
		"url": fmt.Sprintf("https://example.org/%d", k+1), "title": fmt.Sprintf("Result %d", k+1),
		"encrypted_content": signature(sid), "page_age": nil}}}
	return use, result
}

// toolInput is a tool call's arguments as a JSON value ({} when they are
// not JSON).
func toolInput(args string) *json.RawMessage {
	raw := json.RawMessage(args)
	if !json.Valid(raw) {
		raw = json.RawMessage("{}")
	}
	return &raw
}

func (s *Server) serveAnthropic(w http.ResponseWriter, ctx context.Context, req Request, reply Reply, p plan, id string) {
	pace := &pacer{ctx: ctx, reply: reply}
	msg := anMessage{ID: "msg_" + id, Type: "message", Role: "assistant", Model: req.Model, Content: []anBlock{}}
	if !req.Stream {
		if err := pace.waitAll(p.sent()); err != nil {
			return
		}
		if len(p.thinking) > 0 {
			t := join(p.thinking)
			msg.Content = append(msg.Content, anBlock{Type: "thinking", Thinking: ptr(t), Signature: ptr(signature(t))})
		}
		if p.redacted != "" {
			msg.Content = append(msg.Content, anBlock{Type: "redacted_thinking", Data: p.redacted})
		}
		for k := range p.searches {
			use, result := search(id, k)
			msg.Content = append(msg.Content, use, result)
		}
		if len(p.content) > 0 || len(p.calls) == 0 {
			msg.Content = append(msg.Content, anBlock{Type: "text", Text: ptr(join(p.content))})
		}
		for _, c := range p.calls {
			msg.Content = append(msg.Content, anBlock{Type: "tool_use", ID: c.ID, Name: c.Name, Input: toolInput(c.Arguments)})
		}
		msg.StopReason = ptr(p.stopAnthropic())
		msg.Usage = p.anthropicUsage(p.usage.Completion)
		writeJSON(w, http.StatusOK, msg)
		return
	}
	out := newSSE(w)
	event := func(name string, v any) {
		b, _ := json.Marshal(v)
		out.event(name, b)
	}
	msg.Usage = p.anthropicUsage(min(1, p.usage.Completion))
	event("message_start", map[string]any{"type": "message_start", "message": msg})
	tick := func() bool { return pace.tick(out) }
	index := 0
	if len(p.thinking) > 0 {
		event("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": anBlock{Type: "thinking", Thinking: ptr(""), Signature: ptr("")}})
		for _, t := range p.thinking {
			if !tick() {
				return
			}
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
				"delta": map[string]any{"type": "thinking_delta", "thinking": t}})
		}
		event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
			"delta": map[string]any{"type": "signature_delta", "signature": signature(join(p.thinking))}})
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	if p.redacted != "" {
		event("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": anBlock{Type: "redacted_thinking", Data: p.redacted}})
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	for k := range p.searches {
		use, result := search(id, k)
		query := *use.Input
		empty := json.RawMessage("{}")
		use.Input = &empty
		event("content_block_start", map[string]any{"type": "content_block_start", "index": index, "content_block": use})
		event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": string(query)}})
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
		event("content_block_start", map[string]any{"type": "content_block_start", "index": index, "content_block": result})
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	if len(p.content) > 0 || len(p.calls) == 0 {
		event("content_block_start", map[string]any{"type": "content_block_start", "index": index, "content_block": anBlock{Type: "text", Text: ptr("")}})
		event("ping", map[string]any{"type": "ping"})
		for _, t := range p.content {
			if !tick() {
				return
			}
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
				"delta": map[string]any{"type": "text_delta", "text": t}})
		}
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	for _, c := range p.calls {
		if !tick() {
			return
		}
		empty := json.RawMessage("{}")
		event("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": anBlock{Type: "tool_use", ID: c.ID, Name: c.Name, Input: &empty}})
		for _, a := range c.args {
			if !tick() {
				return
			}
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": a}})
		}
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	delta := map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": p.stopAnthropic(), "stop_sequence": nil}}
	if u := p.anthropicUsage(p.usage.Completion); u != nil {
		// Cumulative, as Anthropic's: input and cache counts again
		// (with provider-side tools, they grow during the turn).
		du := map[string]any{"input_tokens": u.InputTokens, "cache_creation_input_tokens": u.CacheCreationInputTokens,
			"cache_read_input_tokens": u.CacheReadInputTokens, "output_tokens": u.OutputTokens}
		if u.ServerToolUse != nil {
			du["server_tool_use"] = u.ServerToolUse
		}
		delta["usage"] = du
	}
	event("message_delta", delta)
	event("message_stop", map[string]any{"type": "message_stop"})
}

func join(tokens []string) string {
	n := 0
	for _, t := range tokens {
		n += len(t)
	}
	b := make([]byte, 0, n)
	for _, t := range tokens {
		b = append(b, t...)
	}
	return string(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeError answers in the API's error format.
func writeError(w http.ResponseWriter, api string, status int, msg string) {
	if api == "gemini" {
		writeJSON(w, status, map[string]any{"error": map[string]any{"code": status, "message": msg, "status": geminiStatus(status)}})
		return
	}
	if api == "anthropic" {
		typ := "api_error"
		switch status {
		case http.StatusBadRequest:
			typ = "invalid_request_error"
		case http.StatusUnauthorized:
			typ = "authentication_error"
		case http.StatusTooManyRequests:
			typ = "rate_limit_error"
		}
		writeJSON(w, status, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
		return
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}
