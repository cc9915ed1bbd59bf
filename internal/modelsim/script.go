package modelsim

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Script decides every reply of the server. Rules are tried in order and
// the first whose When matches the conversation answers; when none does,
// Default answers, and without a Default the server answers 500 naming the
// conversation it could not match. Matching looks only at the request, so
// concurrent conversations never disturb each other and the same request
// always gets the same reply.
type Script struct {
	Rules   []Rule `json:"rules"`
	Default *Reply `json:"default,omitempty"`
}

// Rule is one scripted reply and when to give it.
type Rule struct {
	When  Cond  `json:"when"`
	Reply Reply `json:"reply"`
}

// Cond is a rule on the conversation so far; every field set must hold.
// The zero Cond matches every request.
type Cond struct {
	// Turn is which reply of the conversation this is, from 1: the number
	// of assistant messages in the request plus one. 0: any.
	Turn int `json:"turn,omitempty"`
	// Model is the model the request names.
	Model string `json:"model,omitempty"`
	// API is "openai" (chat completions), "responses" (OpenAI's
	// Responses API), "anthropic" or "gemini".
	API string `json:"api,omitempty"`
	// LastRole is the role of the last message: system, user, assistant
	// or tool (a tool result, in either API).
	LastRole string `json:"last_role,omitempty"`
	// LastContains: the last message's text contains it.
	LastContains string `json:"last_contains,omitempty"`
	// ToolResultContains: the last message is a tool result containing it.
	ToolResultContains string `json:"tool_result_contains,omitempty"`
	// AnyContains: some message's text contains it.
	AnyContains string `json:"any_contains,omitempty"`
	// ToolOffered: the request offers a tool of this name.
	ToolOffered string `json:"tool_offered,omitempty"`
	// ToolChoice is the request's tool choice, the same for both APIs:
	// "auto", "none", "required" (Anthropic's "any") or "tool:NAME".
	ToolChoice string `json:"tool_choice,omitempty"`
}

// Reply is what the server answers.
type Reply struct {
	// Content is the assistant's text; it streams one token at a time
	// (see Tokens).
	Content string `json:"content,omitempty"`
	// ToolCalls are tool calls the assistant makes after its text.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// Reasoning is the model's reasoning before its text; its tokens are
	// output tokens (reasoning tokens in the Responses API's usage). The
	// Responses API shows it as a reasoning item (its summary, and its
	// encrypted_content when the request includes
	// reasoning.encrypted_content); the other APIs keep it hidden, as
	// reasoning models do, and only count it.
	Reasoning string `json:"reasoning,omitempty"`
	// Thinking is the assistant's extended thinking, sent before
	// everything else when the request enables thinking (Anthropic: a
	// thinking block with a signature; streamed as thinking_delta and
	// signature_delta events). Its tokens are output tokens.
	Thinking string `json:"thinking,omitempty"`
	// RedactedThinking, when set and the request enables thinking, is
	// the data of a redacted_thinking block sent after the thinking.
	RedactedThinking string `json:"redacted_thinking,omitempty"`
	// WebSearches is how many searches the provider's own web search
	// tool makes (Anthropic, when the request offers a web_search_*
	// tool): a server_tool_use and a web_search_tool_result block each,
	// counted in usage.server_tool_use.web_search_requests.
	WebSearches int `json:"web_searches,omitempty"`
	// Usage overrides the token counts the server reports; a zero field is
	// computed (prompt: a quarter of the request body's bytes, rounded up;
	// completion: the tokens sent).
	Usage Usage `json:"usage,omitzero"`
	// FirstTokenDelay passes before the first token, TokenDelay between
	// tokens (streaming and not: a non-streaming reply is sent after all
	// of them).
	FirstTokenDelay time.Duration `json:"first_token_delay,omitempty"`
	TokenDelay      time.Duration `json:"token_delay,omitempty"`
	// ContentTokens, when set, is how Content is cut into tokens (they
	// must join to Content), instead of Tokens: a judge's rating digit as
	// a token of its own, as real tokenizers give it.
	ContentTokens []string `json:"content_tokens,omitempty"`
	// NoLogprobs ignores a request for logprobs, as providers without
	// them do: the reply carries none.
	NoLogprobs bool `json:"no_logprobs,omitempty"`
	// TopLogprobs are the alternatives reported for each content token
	// when the request asks for logprobs (OpenAI only), by position; a
	// position without an entry gets generated alternatives.
	TopLogprobs [][]Logprob `json:"top_logprobs,omitempty"`
	// Status and Error script a provider error: the server answers Status
	// with Error as the message, in the API's error format.
	Status int    `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`

	// The rest script a misbehaving provider.

	// IgnoreMaxTokens sends the whole reply even past the request's
	// max_tokens.
	IgnoreMaxTokens bool `json:"ignore_max_tokens,omitempty"`
	// OverReport is added to the completion tokens reported.
	OverReport int64 `json:"over_report,omitempty"`
	// DropUsage reports no usage at all.
	DropUsage bool `json:"drop_usage,omitempty"`
	// CutAfter ends a stream abruptly (no final events) after this many
	// tokens; 0: never.
	CutAfter int `json:"cut_after,omitempty"`
	// LingerAfter keeps a stream open this long after its last event
	// before ending it (a provider slow to close), unless the client
	// goes first.
	LingerAfter time.Duration `json:"linger_after,omitempty"`
}

// ToolCall is a call the assistant makes; Arguments is a JSON object.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Usage are token counts. Prompt counts every input token, cached ones
// included (OpenAI's prompt_tokens); Cached are read from the cache,
// CacheWrite written to it (Anthropic only), of which CacheWrite1h for
// an hour (the rest for five minutes: usage.cache_creation's split);
// Thoughts are thinking tokens reported beside the completion (Gemini's
// thoughtsTokenCount, within maxOutputTokens with the completion).
type Usage struct {
	Prompt       int64 `json:"prompt,omitempty"`
	Completion   int64 `json:"completion,omitempty"`
	Cached       int64 `json:"cached,omitempty"`
	CacheWrite   int64 `json:"cache_write,omitempty"`
	CacheWrite1h int64 `json:"cache_write_1h,omitempty"`
	Thoughts     int64 `json:"thoughts,omitempty"`
}

// Logprob is a token and its log probability.
type Logprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// Message is one message of a conversation as the script sees it, the
// same for every API.
type Message struct {
	// Role is system, user, assistant or tool (a tool result).
	Role string
	// Text is the message's text parts (a tool result's content), joined
	// with newlines.
	Text      string
	ToolCalls []ToolCall
	// ToolCallID is the call a tool result answers.
	ToolCallID string
}

// Request is a request as the script sees it.
type Request struct {
	API      string // "openai", "responses", "anthropic" or "gemini"
	Model    string
	Messages []Message
	Tools    []string // names of the tools offered
	// CustomTools are the names of the Responses API's custom (freeform)
	// tools offered: a call to one is a custom_tool_call whose input is
	// the call's arguments.
	CustomTools []string
	// EncryptedReasoning: a Responses request that includes
	// reasoning.encrypted_content.
	EncryptedReasoning bool
	// ToolChoice is "auto" (also when the request says nothing), "none",
	// "required" or "tool:NAME"; with "none" replies make no tool calls.
	ToolChoice string
	Stream     bool
	// IncludeUsage is OpenAI's stream_options.include_usage.
	IncludeUsage bool
	// MaxTokens is the request's output bound (max_completion_tokens,
	// else max_tokens); 0: none.
	MaxTokens int64
	// Thinking is Anthropic's thinking.budget_tokens when thinking is
	// enabled ("adaptive" thinking: MaxTokens); 0: not enabled.
	Thinking int64
	// ServerTools are the types of the provider-side tools offered
	// (Anthropic's web_search_*, web_fetch_* …).
	ServerTools []string
	// Betas are the anthropic-beta flags the request carried.
	Betas []string
	// Logprobs and TopLogprobs are OpenAI's logprobs and top_logprobs.
	Logprobs    bool
	TopLogprobs int
	// BodyBytes is the size of the request body.
	BodyBytes int
}

// Match returns the reply for req: the first rule that matches, else the
// default.
func (s Script) Match(req Request) (Reply, error) {
	for _, r := range s.Rules {
		if r.When.Holds(req) {
			return r.Reply, r.Reply.check()
		}
	}
	if s.Default != nil {
		return *s.Default, s.Default.check()
	}
	last := "none"
	if n := len(req.Messages); n > 0 {
		m := req.Messages[n-1]
		last = fmt.Sprintf("%s %q", m.Role, clip(m.Text, 80))
	}
	return Reply{}, fmt.Errorf("modelsim: no rule matches reply %d of a %s conversation (model %q, last message %s)",
		req.Turn(), req.API, req.Model, last)
}

// check refuses a reply the server cannot send as scripted.
func (r Reply) check() error {
	if r.ContentTokens != nil && strings.Join(r.ContentTokens, "") != r.Content {
		return fmt.Errorf("modelsim: content_tokens %q do not join to the content %q", r.ContentTokens, clip(r.Content, 80))
	}
	if r.Usage.CacheWrite1h > r.Usage.CacheWrite || r.WebSearches < 0 {
		return fmt.Errorf("modelsim: usage %+v writes more for an hour than in all, or web searches %d is negative", r.Usage, r.WebSearches)
	}
	return nil
}

// Turn is which reply of its conversation req asks for, from 1.
func (req Request) Turn() int {
	n := 1
	for _, m := range req.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

// Holds says whether every condition set in c holds for req.
func (c Cond) Holds(req Request) bool {
	var last Message
	if n := len(req.Messages); n > 0 {
		last = req.Messages[n-1]
	}
	switch {
	case c.Turn != 0 && c.Turn != req.Turn():
	case c.Model != "" && c.Model != req.Model:
	case c.API != "" && c.API != req.API:
	case c.LastRole != "" && c.LastRole != last.Role:
	case c.LastContains != "" && !strings.Contains(last.Text, c.LastContains):
	case c.ToolResultContains != "" && (last.Role != "tool" || !strings.Contains(last.Text, c.ToolResultContains)):
	case c.AnyContains != "" && !anyContains(req.Messages, c.AnyContains):
	case c.ToolOffered != "" && !slices.Contains(req.Tools, c.ToolOffered):
	case c.ToolChoice != "" && c.ToolChoice != req.ToolChoice:
	default:
		return true
	}
	return false
}

func anyContains(ms []Message, s string) bool {
	for _, m := range ms {
		if strings.Contains(m.Text, s) {
			return true
		}
	}
	return false
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Sequence is a script answering the i-th reply of every conversation
// with replies[i-1], and the last one after that.
func Sequence(replies ...Reply) Script {
	var s Script
	for i, r := range replies {
		s.Rules = append(s.Rules, Rule{When: Cond{Turn: i + 1}, Reply: r})
	}
	if n := len(replies); n > 0 {
		last := replies[n-1]
		s.Default = &last
	}
	return s
}
