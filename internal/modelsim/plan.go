package modelsim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// maxTokenBytes is the longest token Tokens makes.
const maxTokenBytes = 8

// Tokens splits s the way the server counts and streams it: each token is
// a run of non-space characters with the spaces before it, cut every 8
// bytes at a character boundary. Joining the tokens gives s back.
func Tokens(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t') {
			i++
		}
		for i < len(s) && s[i] != ' ' && s[i] != '\n' && s[i] != '\t' {
			_, n := utf8.DecodeRuneInString(s[i:])
			if i+n > maxTokenBytes && i > 0 {
				break
			}
			i += n
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}

// plan is what the server sends for one reply: the tokens of the content,
// the tool calls with their argument tokens, why it stopped and the usage
// it reports.
type plan struct {
	reasoning []string // tokens of the reasoning (Reply.Reasoning)
	thinking  []string // tokens of the thinking, sent first
	redacted  string   // a redacted_thinking block's data
	searches  int      // provider-side web searches
	content   []string
	calls     []plannedCall
	truncated bool // stopped at max_tokens
	usage     Usage
	report    bool // report usage at all
}

type plannedCall struct {
	ToolCall
	args []string
}

// sent is how many tokens the plan sends.
func (p plan) sent() int64 {
	n := int64(len(p.reasoning) + len(p.thinking) + len(p.content))
	for _, c := range p.calls {
		n += 1 + int64(len(c.args))
	}
	return n
}

// planReply decides what to send for r in answer to req: it honours
// max_tokens (unless r ignores it), counting one token for each tool
// call's name plus its argument tokens, keeps only whole tool calls, and
// makes none when the request's tool choice is "none".
func planReply(r Reply, req Request) plan {
	p := plan{content: Tokens(r.Content), report: !r.DropUsage}
	if r.ContentTokens != nil { // Match checked that they join to Content
		p.content = slices.Clone(r.ContentTokens)
	}
	limit := int64(math.MaxInt64)
	if req.MaxTokens > 0 && !r.IgnoreMaxTokens {
		limit = req.MaxTokens
	}
	if req.Thinking > 0 {
		// Thinking comes first and counts within max_tokens (and its
		// own budget).
		p.thinking = Tokens(r.Thinking)
		if n := min(limit, req.Thinking); int64(len(p.thinking)) > n {
			p.thinking = p.thinking[:n]
			p.truncated = int64(len(p.thinking)) >= limit
		}
		p.redacted = r.RedactedThinking
		limit -= int64(len(p.thinking))
	}
	// Reasoning (the Responses API's) counts within max_tokens too.
	p.reasoning = Tokens(r.Reasoning)
	if int64(len(p.reasoning)) > limit {
		p.reasoning = p.reasoning[:limit]
		p.truncated = true
	}
	limit -= int64(len(p.reasoning))
	if slices.ContainsFunc(req.ServerTools, func(t string) bool { return strings.HasPrefix(t, "web_search_") }) {
		p.searches = r.WebSearches
	}
	if int64(len(p.content)) > limit {
		p.content = p.content[:limit]
		p.truncated = true
	}
	hidden := int64(len(p.thinking) + len(p.reasoning))
	used := hidden + int64(len(p.content))
	calls := r.ToolCalls
	if req.ToolChoice == "none" {
		calls = nil
	}
	for _, c := range calls {
		args := Tokens(c.Arguments)
		cost := 1 + int64(len(args))
		if used-hidden+cost > limit {
			p.truncated = true
			break
		}
		used += cost
		p.calls = append(p.calls, plannedCall{ToolCall: c, args: args})
	}
	p.usage = r.Usage
	if p.usage.Prompt == 0 {
		p.usage.Prompt = int64(req.BodyBytes+3) / 4
	}
	if p.usage.Completion == 0 {
		p.usage.Completion = used
	} else if full := limit + hidden; p.usage.Completion > full {
		p.usage.Completion = full
	}
	p.usage.Completion += r.OverReport
	return p
}

// finishOpenAI is OpenAI's finish_reason for p.
func (p plan) finishOpenAI() string {
	switch {
	case p.truncated:
		return "length"
	case len(p.calls) > 0:
		return "tool_calls"
	}
	return "stop"
}

// stopAnthropic is Anthropic's stop_reason for p.
func (p plan) stopAnthropic() string {
	switch {
	case p.truncated:
		return "max_tokens"
	case len(p.calls) > 0:
		return "tool_use"
	}
	return "end_turn"
}

// topLogprobs are the n alternatives reported for content token i.
func (r Reply) topLogprobs(i int, token string, n int) []Logprob {
	if i < len(r.TopLogprobs) && len(r.TopLogprobs[i]) > 0 {
		alts := r.TopLogprobs[i]
		return alts[:min(n, len(alts))]
	}
	out := make([]Logprob, 0, n)
	out = append(out, Logprob{Token: token, Logprob: chosenLogprob})
	for k := 1; k < n; k++ {
		out = append(out, Logprob{Token: fmt.Sprintf("%s~%d", strings.TrimSpace(token), k), Logprob: chosenLogprob - float64(k)})
	}
	return out
}

// chosenLogprob is the log probability the server gives a sent token it
// has no scripted alternatives for.
const chosenLogprob = -0.01

// tokenLogprob is the log probability reported for content token i.
func (r Reply) tokenLogprob(i int, token string) float64 {
	if i < len(r.TopLogprobs) {
		for _, a := range r.TopLogprobs[i] {
			if a.Token == token {
				return a.Logprob
			}
		}
	}
	return chosenLogprob
}
