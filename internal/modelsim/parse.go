package modelsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ParseOpenAI reads a chat completions request body.
func ParseOpenAI(body []byte) (Request, error) {
	var b struct {
		Model    string `json:"model"`
		Messages []struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			ToolCallID string          `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
		Stream        bool `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		MaxTokens           *int64          `json:"max_tokens"`
		MaxCompletionTokens *int64          `json:"max_completion_tokens"`
		Logprobs            bool            `json:"logprobs"`
		TopLogprobs         int             `json:"top_logprobs"`
		ToolChoice          json.RawMessage `json:"tool_choice"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return Request{}, fmt.Errorf("chat completions request: %w", err)
	}
	if b.Model == "" {
		return Request{}, errors.New("chat completions request: model is required")
	}
	if len(b.Messages) == 0 {
		return Request{}, errors.New("chat completions request: messages is empty")
	}
	req := Request{API: "openai", Model: b.Model, Stream: b.Stream, Logprobs: b.Logprobs, TopLogprobs: b.TopLogprobs, BodyBytes: len(body)}
	choice, err := toolChoice(b.ToolChoice)
	if err != nil {
		return Request{}, fmt.Errorf("chat completions request: %w", err)
	}
	req.ToolChoice = choice
	if b.StreamOptions != nil {
		req.IncludeUsage = b.StreamOptions.IncludeUsage
	}
	for _, bound := range []*int64{b.MaxCompletionTokens, b.MaxTokens} {
		if bound != nil {
			if *bound < 1 {
				return Request{}, fmt.Errorf("chat completions request: max tokens %d is below 1", *bound)
			}
			if req.MaxTokens == 0 {
				req.MaxTokens = *bound
			}
		}
	}
	if req.TopLogprobs < 0 || req.TopLogprobs > 20 {
		return Request{}, fmt.Errorf("chat completions request: top_logprobs %d is not in [0, 20]", req.TopLogprobs)
	}
	for _, t := range b.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
	}
	for i, m := range b.Messages {
		text, err := openAIText(m.Content)
		if err != nil {
			return Request{}, fmt.Errorf("chat completions request: messages[%d]: %w", i, err)
		}
		role := m.Role
		switch role {
		case "developer":
			role = "system"
		case "system", "user", "assistant", "tool":
		default:
			return Request{}, fmt.Errorf("chat completions request: messages[%d]: unknown role %q", i, m.Role)
		}
		msg := Message{Role: role, Text: text, ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
		req.Messages = append(req.Messages, msg)
	}
	return req, nil
}

// toolChoice reads either API's tool_choice: OpenAI's "auto", "none",
// "required" or {"type": "function", "function": {"name"}}; Anthropic's
// {"type": "auto" | "any" | "none" | "tool", "name"}.
func toolChoice(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "auto", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return s, nil
		}
		return "", fmt.Errorf("tool_choice %q is not auto, none or required", s)
	}
	var o struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("tool_choice: %w", err)
	}
	switch o.Type {
	case "auto", "none":
		return o.Type, nil
	case "any":
		return "required", nil
	case "tool":
		return "tool:" + o.Name, nil
	case "function":
		return "tool:" + o.Function.Name, nil
	}
	return "", fmt.Errorf("tool_choice type %q is unknown", o.Type)
}

// openAIText is a message's content: a string, null, or text parts.
func openAIText(raw json.RawMessage) (string, error) {
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
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// ParseAnthropic reads a Messages request body. A user message's
// tool_result blocks become tool messages (in order), its other text a
// user message after them. It takes Claude Code's requests: system as a
// list of blocks with cache_control, tools with input_schema or of a
// server tool's type, thinking, metadata.
func ParseAnthropic(body []byte) (Request, error) { return parseAnthropic(body, true) }

// ParseAnthropicCount reads a token counting request body: a Messages
// request without max_tokens.
func ParseAnthropicCount(body []byte) (Request, error) { return parseAnthropic(body, false) }

func parseAnthropic(body []byte, needMax bool) (Request, error) {
	var b struct {
		Model    string          `json:"model"`
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
		Stream     bool            `json:"stream"`
		MaxTokens  *int64          `json:"max_tokens"`
		ToolChoice json.RawMessage `json:"tool_choice"`
		Thinking   *struct {
			Type         string `json:"type"`
			BudgetTokens int64  `json:"budget_tokens"`
		} `json:"thinking"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return Request{}, fmt.Errorf("messages request: %w", err)
	}
	if b.Model == "" {
		return Request{}, errors.New("messages request: model is required")
	}
	if needMax && (b.MaxTokens == nil || *b.MaxTokens < 1) {
		return Request{}, errors.New("messages request: max_tokens is required and at least 1")
	}
	if len(b.Messages) == 0 {
		return Request{}, errors.New("messages request: messages is empty")
	}
	req := Request{API: "anthropic", Model: b.Model, Stream: b.Stream, BodyBytes: len(body)}
	if b.MaxTokens != nil {
		req.MaxTokens = *b.MaxTokens
	}
	if t := b.Thinking; t != nil {
		switch t.Type {
		case "enabled":
			// As Anthropic: at least 1024, and below max_tokens.
			if t.BudgetTokens < 1024 || (needMax && t.BudgetTokens >= req.MaxTokens) {
				return Request{}, fmt.Errorf("messages request: thinking.budget_tokens %d: want at least 1024 and below max_tokens (%d)", t.BudgetTokens, req.MaxTokens)
			}
			req.Thinking = t.BudgetTokens
		case "adaptive":
			req.Thinking = max(req.MaxTokens, 1)
		case "disabled", "":
		default:
			return Request{}, fmt.Errorf("messages request: thinking.type %q is unknown", t.Type)
		}
	}
	choice, err := toolChoice(b.ToolChoice)
	if err != nil {
		return Request{}, fmt.Errorf("messages request: %w", err)
	}
	req.ToolChoice = choice
	for _, t := range b.Tools {
		if t.Type != "" && t.Type != "custom" {
			req.ServerTools = append(req.ServerTools, t.Type)
			continue
		}
		req.Tools = append(req.Tools, t.Name)
	}
	if len(b.System) > 0 && string(b.System) != "null" {
		text, _, _, err := anthropicBlocks(b.System)
		if err != nil {
			return Request{}, fmt.Errorf("messages request: system: %w", err)
		}
		req.Messages = append(req.Messages, Message{Role: "system", Text: text})
	}
	for i, m := range b.Messages {
		// Claude Code sends system messages among the others (its
		// environment, reminders); they are system messages here.
		if m.Role != "user" && m.Role != "assistant" && m.Role != "system" {
			return Request{}, fmt.Errorf("messages request: messages[%d]: unknown role %q", i, m.Role)
		}
		text, calls, results, err := anthropicBlocks(m.Content)
		if err != nil {
			return Request{}, fmt.Errorf("messages request: messages[%d]: %w", i, err)
		}
		req.Messages = append(req.Messages, results...)
		if m.Role == "assistant" || text != "" || len(results) == 0 {
			req.Messages = append(req.Messages, Message{Role: m.Role, Text: text, ToolCalls: calls})
		}
	}
	return req, nil
}

// anthropicBlocks reads content: a string or a list of blocks. It returns
// the text blocks joined, the tool_use blocks and the tool_result blocks
// as tool messages.
func anthropicBlocks(raw json.RawMessage) (string, []ToolCall, []Message, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil, nil, nil
	}
	var blocks []struct {
		Type      string          `json:"type"`
		Text      string          `json:"text"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", nil, nil, fmt.Errorf("content is neither a string nor a list of blocks: %w", err)
	}
	var texts []string
	var calls []ToolCall
	var results []Message
	for i, bl := range blocks {
		switch bl.Type {
		case "text":
			texts = append(texts, bl.Text)
		case "tool_use":
			calls = append(calls, ToolCall{ID: bl.ID, Name: bl.Name, Arguments: string(bl.Input)})
		case "tool_result":
			text := ""
			if len(bl.Content) > 0 && string(bl.Content) != "null" {
				t, _, _, err := anthropicBlocks(bl.Content)
				if err != nil {
					return "", nil, nil, fmt.Errorf("block %d: tool_result content: %w", i, err)
				}
				text = t
			}
			results = append(results, Message{Role: "tool", Text: text, ToolCallID: bl.ToolUseID})
		}
	}
	return strings.Join(texts, "\n"), calls, results, nil
}
