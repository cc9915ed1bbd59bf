package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// This file reads and rewrites Anthropic Messages: requests, answers and
// streams, the anthropic-beta flags passed on, and the provider-side
// tools a model may use. Pure, like openai.go (count_tokens.go serves the
// token counting endpoint).

// unsupportedMessages are request fields whose cost the gateway cannot
// bound or price.
var unsupportedMessages = map[string]string{
	"mcp_servers": "MCP servers run at the provider and bill their own tokens",
	"container":   "code execution containers are billed by the provider",
}

// parseMessagesRequest reads a Messages request body. Tools of the
// server-tool kinds the gateway can meter (web_search_*, web_fetch_*)
// pass here; whether the model allows them is decided with its route
// (prepareMessages).
func parseMessagesRequest(body []byte) (callRequest, error) {
	r, contents, err := parseRequest(body, unsupportedMessages, messagesToolTypes(body), "custom tools and the server tools the model's configuration prices")
	if err != nil {
		return r, err
	}
	var maxTokens *int64
	if err := jsonField(r.fields, "max_tokens", &maxTokens); err != nil {
		return r, err
	}
	if maxTokens == nil || *maxTokens < 1 {
		return r, errors.New("max_tokens is required and at least 1")
	}
	r.Requested = *maxTokens
	// Fields that change the price per token: only the standard one.
	for _, f := range []struct{ name, why string }{
		{"speed", "fast mode is priced above the price table"},
		{"inference_geo", "inference pinned to a region is priced above the price table"},
	} {
		var v string
		if err := jsonField(r.fields, f.name, &v); err != nil {
			return r, err
		}
		if v != "" && v != "standard" && v != "global" {
			return r, fmt.Errorf("%s %q is not supported by the gateway: %s", f.name, v, f.why)
		}
	}
	var system json.RawMessage
	_ = jsonField(r.fields, "system", &system)
	if n, err := countBlocks(system, 0); err != nil {
		return r, fmt.Errorf("system: %w", err)
	} else {
		r.Images += n
	}
	for i, c := range contents {
		n, err := countBlocks(c, 0)
		if err != nil {
			return r, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		r.Images += n
	}
	return r, nil
}

// messagesToolTypes are the tool types a Messages request may name: a
// custom tool's, and those of its tools that are of a server-tool kind
// the gateway can meter.
func messagesToolTypes(body []byte) []string {
	types := []string{"", "custom"}
	var b struct {
		Tools []struct {
			Type string `json:"type"`
		} `json:"tools"`
	}
	if json.Unmarshal(body, &b) != nil {
		return types
	}
	for _, t := range b.Tools {
		if serverToolKind(t.Type) != "" {
			types = append(types, t.Type)
		}
	}
	return types
}

// serverToolKind is the kind of a server tool's type (web_search for
// web_search_20250305), "" when the gateway cannot meter it.
func serverToolKind(typ string) string {
	for _, k := range serverToolKinds {
		if strings.HasPrefix(typ, k+"_") {
			return k
		}
	}
	return ""
}

// The anthropic-beta flags the gateway passes to Anthropic: each changes
// only what the tokens are (or how they stream), never adds a cost the
// token prices and the call's bound do not cover. Claude Code 2.x sends
// claude-code-20250219, interleaved-thinking-2025-05-14,
// fine-grained-tool-streaming-2025-05-14, context-management-2025-06-27
// and, by model and setting, effort, structured outputs, tool examples,
// advanced tool use and web search; all pass. A provider's
// anthropic_betas add to the list (DefaultAnthropicBetas lists them).
var defaultAnthropicBetas = []string{
	"claude-code-20250219",                   // names the client; no cost
	"interleaved-thinking-2025-05-14",        // thinking between tool calls, within max_tokens
	"fine-grained-tool-streaming-2025-05-14", // how tool input streams
	"token-efficient-tools-2025-02-19",       // fewer output tokens for tool calls
	"prompt-caching-2024-07-31",              // caching, priced (cache reads and writes)
	"prompt-caching-scope-2026-01-05",        // where a cache entry is shared; priced the same
	"context-management-2025-06-27",          // clears old tool results: fewer input tokens
	"effort-2025-11-24",                      // how much of max_tokens to spend
	"structured-outputs-2025-11-13",          // constrained output, within max_tokens
	"structured-outputs-2025-12-15",
	"output-128k-2025-02-19",                   // a larger max_tokens, which the gateway lowers
	"model-context-window-exceeded-2025-08-26", // a stop reason
	"tool-examples-2025-10-29",                 // tool input examples, in the body
	"advanced-tool-use-2025-11-20",             // tool search over deferred tools; server tools still gated
	"web-search-2025-03-05",                    // the tool itself is gated by server_tools
	"web-fetch-2025-09-10",                     // the tool itself is gated by server_tools
}

// DefaultAnthropicBetas are the anthropic-beta flags the gateway passes
// to every Anthropic provider.
func DefaultAnthropicBetas() []string { return slices.Clone(defaultAnthropicBetas) }

// refusedBetas say why well-known flags are refused.
var refusedBetas = map[string]string{
	"oauth-2025-04-20":          "the gateway calls the provider with its own API key",
	"context-1m-2025-08-07":     "prompts over 200k tokens are priced above the price table",
	"files-api-2025-04-14":      "a file's tokens cannot be bounded from the request",
	"mcp-client-2025-04-04":     "MCP servers run at the provider and bill their own tokens",
	"mcp-servers-2025-12-04":    "MCP servers run at the provider and bill their own tokens",
	"code-execution-2025-05-22": "code execution is billed by container time",
	"code-execution-2025-08-25": "code execution is billed by container time",
	"skills-2025-10-02":         "skills run in billed code execution containers",
	"compact-2026-01-12":        "server-side compaction makes sampling calls of its own",
}

// anthropicBetas is the set of flags a provider takes.
func anthropicBetas(extra []string) map[string]bool {
	m := make(map[string]bool, len(defaultAnthropicBetas)+len(extra))
	for _, b := range defaultAnthropicBetas {
		m[b] = true
	}
	for _, b := range extra {
		m[b] = true
	}
	return m
}

// checkBetas reads the anthropic-beta headers (comma-separated flags,
// in one or several lines) and returns them as one value to forward; a
// flag not in allowed is refused, every such flag named.
func checkBetas(h http.Header, allowed map[string]bool) (string, error) {
	var flags, bad []string
	for _, line := range h.Values("anthropic-beta") {
		for _, f := range strings.Split(line, ",") {
			f = strings.TrimSpace(f)
			if f == "" || slices.Contains(flags, f) {
				continue
			}
			if !allowed[f] {
				if why, ok := refusedBetas[f]; ok {
					f += " (" + why + ")"
				}
				bad = append(bad, f)
				continue
			}
			flags = append(flags, f)
		}
	}
	if len(bad) > 0 {
		return "", fmt.Errorf("anthropic-beta %s not supported by the gateway: their cost cannot be bounded or priced before the call (see the gateway's documentation for the flags it passes)",
			strings.Join(bad, ", "))
	}
	return strings.Join(flags, ","), nil
}

// callExtra is what a request's route adds to its plan and forwarding:
// input tokens provider-side tools may add, the rounds of sampling they
// may cause (each reads the whole input again), their fees, a smaller
// floor on the output (extended thinking needs 1025 tokens), and the
// headers to send the provider.
type callExtra struct {
	ToolTokens int64
	Rounds     int64
	Fees       Money
	MinOutput  int64
	Header     http.Header
}

// inputTokens is the input bound of a call whose body bounds base tokens:
// every round reads the input and what the tools added.
func (e callExtra) inputTokens(base int64) int64 {
	return mul(add(base, e.ToolTokens), max(e.Rounds, 1))
}

// minThinkingOutput is the fewest output tokens a call with extended
// thinking can be made with: Anthropic's smallest budget_tokens (1024),
// below max_tokens.
const minThinkingOutput = 1025

// prepareMessages checks a Messages request against its route: the
// anthropic-beta flags (refused unless allowed), the server tools
// (refused unless the model prices them, then bounded: the most uses
// configured, each adding at most its input tokens and a round of
// sampling, and its fee), and extended thinking's floor.
func prepareMessages(r callRequest, rt route, h http.Header) (callExtra, error) {
	e := callExtra{Rounds: 1, Header: http.Header{}}
	betas, err := checkBetas(h, rt.betas)
	if err != nil {
		return e, err
	}
	if betas != "" {
		e.Header.Set("anthropic-beta", betas)
	}
	e.Header.Set("anthropic-version", cmpOr(h.Get("anthropic-version"), rt.provider.AnthropicVersion))
	var tools []map[string]json.RawMessage
	if err := jsonField(r.fields, "tools", &tools); err != nil {
		return e, err
	}
	var uses int64
	for i, t := range tools {
		var typ string
		_ = json.Unmarshal(t["type"], &typ)
		if serverToolKind(typ) == "" {
			continue
		}
		st, ok := rt.tools[typ]
		if !ok {
			return e, fmt.Errorf("tools[%d]: server tool %q is not offered for model %q by the gateway (it is billed by the provider per use; the operator may price it in server_tools)", i, typ, r.Model)
		}
		n := st.maxUses
		var asked *int64
		if err := jsonField(t, "max_uses", &asked); err != nil {
			return e, fmt.Errorf("tools[%d]: %w", i, err)
		}
		if asked != nil && *asked >= 1 && *asked < n {
			n = *asked
		}
		uses = add(uses, n)
		e.ToolTokens = add(e.ToolTokens, mul(n, st.perUse))
		e.Fees = Money(add(int64(e.Fees), mul(n, int64(st.price))))
	}
	e.Rounds = add(uses, 1)
	// Results of earlier server tool uses, sent back in the assistant's
	// turns: opaque, so each is bounded by its tool's tokens per use.
	results, err := serverToolResults(r.fields)
	if err != nil {
		return e, err
	}
	for kind, n := range results {
		var st *serverTool
		for _, t := range rt.tools {
			if t.kind == kind {
				st = &t
			}
		}
		if st == nil {
			return e, fmt.Errorf("messages hold %s results, from a server tool model %q is not offered by the gateway", kind, r.Model)
		}
		e.ToolTokens = add(e.ToolTokens, mul(n, st.perUse))
	}
	var thinking struct {
		Type string `json:"type"`
	}
	if err := jsonField(r.fields, "thinking", &thinking); err != nil {
		return e, err
	}
	if thinking.Type == "enabled" {
		e.MinOutput = minThinkingOutput
	}
	return e, nil
}

// serverToolResults counts the server tool result blocks of a request's
// messages by the tool's kind.
func serverToolResults(fields map[string]json.RawMessage) (map[string]int64, error) {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := jsonField(fields, "messages", &msgs); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, m := range msgs {
		if len(m.Content) == 0 || m.Content[0] != '[' {
			continue
		}
		var blocks []struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return nil, err
		}
		for _, b := range blocks {
			if kind, ok := strings.CutSuffix(b.Type, "_tool_result"); ok && serverToolKind(kind+"_") != "" {
				out[kind]++
			}
		}
	}
	return out, nil
}

// countBlocks checks content (a string or a list of blocks) for block
// types whose tokens the gateway can bound, and counts its images
// (tool results' included).
func countBlocks(raw json.RawMessage, depth int) (int64, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return 0, nil
	}
	if depth > 1 {
		return 0, errors.New("blocks nested too deep")
	}
	var blocks []struct {
		Type    string          `json:"type"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return 0, err
	}
	var images int64
	for j, b := range blocks {
		switch b.Type {
		case "text", "tool_use", "thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result", "web_fetch_tool_result":
			// A server tool's result may be opaque (encrypted search
			// results): prepareMessages bounds it by its tool's
			// configuration.
		case "image":
			images++
		case "tool_result":
			n, err := countBlocks(b.Content, depth+1)
			if err != nil {
				return 0, fmt.Errorf("[%d] tool_result: %w", j, err)
			}
			images += n
		default:
			return 0, fmt.Errorf("[%d]: block type %q is not supported by the gateway (its tokens cannot be bounded)", j, b.Type)
		}
	}
	return images, nil
}

// rewriteMessages is the body sent to the provider: the client's, with
// the upstream model name, max_tokens lowered to maxOut (an extended
// thinking budget kept below it), and each server tool's max_uses (and
// web fetch's max_content_tokens) lowered to what its configuration
// bounds.
func rewriteMessages(r callRequest, upstream string, maxOut int64, tools map[string]serverTool) ([]byte, error) {
	f := r.edit()
	set := f.set
	set("model", upstream)
	set("max_tokens", maxOut)
	if raw, ok := f["tools"]; ok && len(tools) > 0 {
		var ts []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &ts); err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
		changed := false
		for _, t := range ts {
			var typ string
			_ = json.Unmarshal(t["type"], &typ)
			st, ok := tools[typ]
			if !ok {
				continue
			}
			lower := func(k string, bound int64) {
				var v int64
				if json.Unmarshal(t[k], &v) != nil || v < 1 || v > bound {
					t[k], _ = json.Marshal(bound)
					changed = true
				}
			}
			lower("max_uses", st.maxUses)
			if st.kind == "web_fetch" {
				lower("max_content_tokens", st.perUse)
			}
		}
		if changed {
			b, err := marshalNoEscape(ts)
			if err != nil {
				return nil, fmt.Errorf("tools: %w", err)
			}
			f["tools"] = b
		}
	}
	if raw, ok := f["thinking"]; ok && string(raw) != "null" {
		var t map[string]json.RawMessage
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("thinking: %w", err)
		}
		var budget int64
		if err := jsonField(t, "budget_tokens", &budget); err != nil {
			return nil, fmt.Errorf("thinking: %w", err)
		}
		if budget >= maxOut {
			b, _ := json.Marshal(max(maxOut-1, 0))
			t["budget_tokens"] = b
			set("thinking", t)
		}
	}
	return marshalFields(f)
}

// marshalNoEscape is v as JSON, text as it came (no HTML escapes).
func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// messagesUsage is Anthropic's usage object.
type messagesUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	// CacheCreation splits the cache writes by lifetime.
	CacheCreation *struct {
		Ephemeral5m *int64 `json:"ephemeral_5m_input_tokens,omitempty"`
		Ephemeral1h *int64 `json:"ephemeral_1h_input_tokens,omitempty"`
	} `json:"cache_creation,omitempty"`
	// ServerToolUse counts provider-side tool uses.
	ServerToolUse *struct {
		WebSearchRequests *int64 `json:"web_search_requests,omitempty"`
		WebFetchRequests  *int64 `json:"web_fetch_requests,omitempty"`
	} `json:"server_tool_use,omitempty"`
}

// merge takes the fields v sets (message_delta's usage is cumulative and
// may set any of them).
func (u *messagesUsage) merge(v messagesUsage) {
	for _, f := range []struct{ to, from **int64 }{{&u.InputTokens, &v.InputTokens}, {&u.OutputTokens, &v.OutputTokens},
		{&u.CacheCreationInputTokens, &v.CacheCreationInputTokens}, {&u.CacheReadInputTokens, &v.CacheReadInputTokens}} {
		if *f.from != nil {
			*f.to = *f.from
		}
	}
	if v.CacheCreation != nil {
		u.CacheCreation = v.CacheCreation
	}
	if v.ServerToolUse != nil {
		u.ServerToolUse = v.ServerToolUse
	}
}

func (u messagesUsage) usage() (Usage, error) {
	if u.InputTokens == nil || u.OutputTokens == nil {
		return Usage{}, errors.New("usage lacks input_tokens or output_tokens")
	}
	val := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	fresh, read, write := *u.InputTokens, val(u.CacheReadInputTokens), val(u.CacheCreationInputTokens)
	if fresh < 0 || read < 0 || write < 0 {
		return Usage{}, fmt.Errorf("usage has a negative count (input %d, cache read %d, cache write %d)", fresh, read, write)
	}
	out := Usage{Input: add(add(fresh, read), write), Output: *u.OutputTokens, CachedInput: read, CacheWrite: write}
	if c := u.CacheCreation; c != nil {
		// Writes are priced by lifetime only when the split adds up;
		// otherwise all at the longest lifetime's price.
		w5, w1 := val(c.Ephemeral5m), val(c.Ephemeral1h)
		if w5 >= 0 && w1 >= 0 && add(w5, w1) == write {
			out.CacheWrite5m = w5
		}
	}
	if t := u.ServerToolUse; t != nil {
		out.WebSearches, out.WebFetches = val(t.WebSearchRequests), val(t.WebFetchRequests)
	}
	return valid(out)
}

// parseMessagesResponse reads a non-streaming answer's usage.
func parseMessagesResponse(body []byte) (Usage, bool, error) { return answerUsage[messagesUsage](body) }

// messagesAssembler rebuilds a Message from its stream of events.
type messagesAssembler struct {
	message  map[string]json.RawMessage // message_start's message
	blocks   []*messagesBlockAcc
	usage    messagesUsage
	gotUsage bool
	// final: a message_delta brought the final, cumulative usage (the
	// output count in message_start is a placeholder).
	final    bool
	stop     json.RawMessage // message_delta's delta
	errEvent json.RawMessage
	done     bool
}

type messagesBlockAcc struct {
	start                 map[string]json.RawMessage
	text, json, signature strings.Builder
	thinking              strings.Builder
	citations             []json.RawMessage
}

// maxCitations bounds the citations kept of one block.
const maxCitations = 4096

// maxBlocks bounds a message's content blocks.
const maxBlocks = 1024

// Event takes the data of one event (its type is in the data too).
func (a *messagesAssembler) Event(data []byte) (chunkInfo, error) {
	var e struct {
		Type         string                     `json:"type"`
		Message      map[string]json.RawMessage `json:"message"`
		Index        int                        `json:"index"`
		ContentBlock map[string]json.RawMessage `json:"content_block"`
		Delta        json.RawMessage            `json:"delta"`
		Usage        *messagesUsage             `json:"usage"`
		Error        json.RawMessage            `json:"error"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return chunkInfo{}, fmt.Errorf("stream event: %w", err)
	}
	block := func() (*messagesBlockAcc, error) { return slot(&a.blocks, e.Index, maxBlocks, "content block") }
	var info chunkInfo
	switch e.Type {
	case "message_start":
		a.message = e.Message
		var m struct {
			Usage *messagesUsage `json:"usage"`
		}
		if raw, ok := e.Message["usage"]; ok {
			if err := json.Unmarshal(raw, &m.Usage); err != nil {
				return info, fmt.Errorf("message_start usage: %w", err)
			}
		}
		if m.Usage != nil {
			a.usage.merge(*m.Usage)
			a.gotUsage = true
		}
	case "content_block_start":
		b, err := block()
		if err != nil {
			return info, err
		}
		b.start = e.ContentBlock
	case "content_block_delta":
		b, err := block()
		if err != nil {
			return info, err
		}
		var d struct {
			Type        string          `json:"type"`
			Text        string          `json:"text"`
			PartialJSON string          `json:"partial_json"`
			Thinking    string          `json:"thinking"`
			Signature   string          `json:"signature"`
			Citation    json.RawMessage `json:"citation"`
		}
		if err := json.Unmarshal(e.Delta, &d); err != nil {
			return info, fmt.Errorf("content_block_delta: %w", err)
		}
		b.text.WriteString(d.Text)
		b.json.WriteString(d.PartialJSON)
		b.thinking.WriteString(d.Thinking)
		b.signature.WriteString(d.Signature)
		if d.Type == "citations_delta" && len(d.Citation) > 0 && len(b.citations) < maxCitations {
			b.citations = append(b.citations, d.Citation)
		}
		info.Token = d.Text != "" || d.PartialJSON != "" || d.Thinking != ""
	case "message_delta":
		a.stop = e.Delta
		if e.Usage != nil {
			a.usage.merge(*e.Usage)
			a.gotUsage, a.final = true, true
		}
	case "message_stop":
		a.done = true
		info.Done = true
	case "error":
		a.errEvent = e.Error
	}
	return info, nil
}

// Usage is the stream's final usage; a stream that ended before it has
// none (what message_start says is not what the call cost).
func (a *messagesAssembler) Usage() (Usage, bool, error) {
	if !a.gotUsage {
		return Usage{}, false, nil
	}
	if !a.final {
		return Usage{}, false, errors.New("the stream ended before its final usage (message_delta)")
	}
	u, err := a.usage.usage()
	return u, err == nil, err
}

// Complete says whether the stream ended with message_stop.
func (a *messagesAssembler) Complete() bool { return a.done }

// Response is the Message the stream amounts to.
func (a *messagesAssembler) Response() []byte {
	out := map[string]json.RawMessage{}
	for k, v := range a.message {
		out[k] = v
	}
	set := func(k string, v any) {
		b, _ := json.Marshal(v)
		out[k] = b
	}
	content := make([]map[string]json.RawMessage, 0, len(a.blocks))
	for _, b := range a.blocks {
		c := map[string]json.RawMessage{}
		for k, v := range b.start {
			c[k] = v
		}
		var typ string
		_ = json.Unmarshal(c["type"], &typ)
		put := func(k string, v any) {
			raw, _ := json.Marshal(v)
			c[k] = raw
		}
		switch typ {
		case "text":
			put("text", b.text.String())
			if len(b.citations) > 0 {
				put("citations", b.citations)
			}
		case "tool_use", "server_tool_use":
			in := bytes.TrimSpace([]byte(b.json.String()))
			switch {
			case len(in) == 0:
				c["input"] = json.RawMessage("{}")
			case json.Valid(in):
				c["input"] = in
			default:
				put("input", string(in))
			}
		case "thinking":
			put("thinking", b.thinking.String())
			put("signature", b.signature.String())
		}
		// Other blocks (redacted_thinking, web_search_tool_result …)
		// come whole in their content_block_start.
		content = append(content, c)
	}
	set("content", content)
	if a.stop != nil {
		var d map[string]json.RawMessage
		if json.Unmarshal(a.stop, &d) == nil {
			for _, k := range []string{"stop_reason", "stop_sequence"} {
				if v, ok := d[k]; ok {
					out[k] = v
				}
			}
		}
	}
	if a.gotUsage {
		set("usage", a.usage)
	}
	if a.errEvent != nil {
		out["error"] = a.errEvent
	}
	b, _ := json.Marshal(out)
	return b
}

// messagesTexts are the text blocks of an answer joined (HAL's outputs).
func messagesTexts(body []byte) []string {
	var r struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(body, &r) != nil {
		return []string{}
	}
	var texts []string
	for _, c := range r.Content {
		if c.Type == "text" {
			texts = append(texts, c.Text)
		}
	}
	return []string{strings.Join(texts, "")}
}
