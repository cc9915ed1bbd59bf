package verify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// APIs of recorded exchanges (the gateway's call names).
const (
	APIOpenAIChat        = "openai.chat.completions"
	APIAnthropicMessages = "anthropic.messages"
)

// Exchange is one model call of an attempt as recorded: the request body
// the agent sent and the answer body it got (a stream as the answer it
// amounts to).
type Exchange struct {
	API string
	// Model is the model the request asked for ("": not known); a replay
	// call is paired only with a recorded call of the same model.
	Model    string
	Request  []byte
	Response []byte
	// Failed: the call got no answer from the model (a refusal, an
	// error); its response, if any, is not a message.
	Failed bool
	// ID names the exchange ("<attempt>/<seq>", the gateway's records);
	// ReplayOf, on a replay's exchange, names the recorded exchange whose
	// answer it was given. Both are optional: without them a replay's
	// exchanges are paired with the recorded ones as the gateway pairs
	// them (Matcher).
	ID       string
	ReplayOf string
}

// Roles of messages.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is a chat message reduced to what verification compares: who
// spoke, the text, the tool calls made (assistant) or answered (tool).
// Anthropic's tool_result blocks become tool messages of their own, its
// system field a system message.
type Message struct {
	Role   string     `json:"role"`
	Text   string     `json:"text,omitempty"`
	Calls  []ToolCall `json:"calls,omitempty"`
	CallID string     `json:"call_id,omitempty"`
}

// ToolCall is one call an assistant message makes; Args is the
// arguments' canonical JSON (the raw text when it is not JSON).
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Args string `json:"args"`
}

// Equal reports whether m and o are the same message.
func (m Message) Equal(o Message) bool {
	return m.Role == o.Role && strings.TrimSpace(m.Text) == strings.TrimSpace(o.Text) && m.CallID == o.CallID &&
		slices.Equal(m.Calls, o.Calls)
}

// canonicalJSON re-encodes JSON with sorted keys and no spaces; text that
// is not JSON is returned as it is.
func canonicalJSON(s []byte) string {
	var v any
	d := json.NewDecoder(bytes.NewReader(s))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return string(s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return string(s)
	}
	return string(b)
}

// contentText reads a content field: a string, null, or a list of parts
// whose text parts are joined (other parts, such as images, are named by
// type so that a change of them is seen).
func contentText(raw json.RawMessage) (string, []json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, errors.New("content is neither a string nor a list of parts")
	}
	var b strings.Builder
	var others []json.RawMessage
	for _, p := range parts {
		var part struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(p, &part); err != nil {
			return "", nil, fmt.Errorf("content part: %w", err)
		}
		switch part.Type {
		case "text", "input_text", "output_text":
			b.WriteString(part.Text)
		default:
			others = append(others, p)
		}
	}
	return b.String(), others, nil
}

type chatMessage struct {
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
}

func (c chatMessage) message() (Message, error) {
	text, others, err := contentText(c.Content)
	if err != nil {
		return Message{}, err
	}
	for _, o := range others {
		text += "\n" + canonicalJSON(o)
	}
	m := Message{Role: c.Role, Text: text, CallID: c.ToolCallID}
	if m.Role == "developer" {
		m.Role = RoleSystem
	}
	for _, tc := range c.ToolCalls {
		m.Calls = append(m.Calls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Args: canonicalJSON([]byte(tc.Function.Arguments))})
	}
	return m, nil
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// messages reads an Anthropic message into one message, or, for a user
// message with tool_result blocks, a tool message per result and a user
// message for the rest.
func (a anthropicMessage) messages() ([]Message, error) {
	var s string
	if err := json.Unmarshal(a.Content, &s); err == nil {
		return []Message{{Role: a.Role, Text: s}}, nil
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
	if err := json.Unmarshal(a.Content, &blocks); err != nil {
		return nil, errors.New("content is neither a string nor a list of blocks")
	}
	var out []Message
	m := Message{Role: a.Role}
	for _, b := range blocks {
		switch b.Type {
		case "text":
			m.Text += b.Text
		case "tool_use":
			m.Calls = append(m.Calls, ToolCall{ID: b.ID, Name: b.Name, Args: canonicalJSON(b.Input)})
		case "tool_result":
			text, others, err := contentText(b.Content)
			if err != nil {
				return nil, fmt.Errorf("tool_result %s: %w", b.ToolUseID, err)
			}
			for _, o := range others {
				text += "\n" + canonicalJSON(o)
			}
			out = append(out, Message{Role: RoleTool, CallID: b.ToolUseID, Text: text})
		case "thinking", "redacted_thinking":
			// Not shown to the model as text again; signed by the provider.
		default:
			raw, _ := json.Marshal(b)
			m.Text += "\n" + canonicalJSON(raw)
		}
	}
	if m.Text != "" || len(m.Calls) > 0 || len(out) == 0 {
		out = append(out, m)
	}
	return out, nil
}

// RequestMessages reads the conversation a request shows the model.
func RequestMessages(api string, body []byte) ([]Message, error) {
	switch api {
	case APIOpenAIChat:
		var r struct {
			Messages []chatMessage `json:"messages"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, fmt.Errorf("chat request: %w", err)
		}
		out := make([]Message, 0, len(r.Messages))
		for i, cm := range r.Messages {
			m, err := cm.message()
			if err != nil {
				return nil, fmt.Errorf("chat request: message %d: %w", i, err)
			}
			out = append(out, m)
		}
		return out, nil
	case APIAnthropicMessages:
		var r struct {
			System   json.RawMessage    `json:"system"`
			Messages []anthropicMessage `json:"messages"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, fmt.Errorf("messages request: %w", err)
		}
		var out []Message
		if len(r.System) > 0 && string(r.System) != "null" {
			text, _, err := contentText(r.System)
			if err != nil {
				return nil, fmt.Errorf("messages request: system: %w", err)
			}
			out = append(out, Message{Role: RoleSystem, Text: text})
		}
		for i, am := range r.Messages {
			ms, err := am.messages()
			if err != nil {
				return nil, fmt.Errorf("messages request: message %d: %w", i, err)
			}
			out = append(out, ms...)
		}
		return out, nil
	case APIOpenAIResponses:
		return responsesRequest(body)
	case APIGeminiGenerate:
		return geminiRequest(body)
	}
	return nil, fmt.Errorf("unknown API %q", api)
}

// ResponseMessage reads the assistant message an answer gives (the first
// choice of a chat completion).
func ResponseMessage(api string, body []byte) (Message, error) {
	switch api {
	case APIOpenAIChat:
		var r struct {
			Choices []struct {
				Message chatMessage `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return Message{}, fmt.Errorf("chat answer: %w", err)
		}
		if len(r.Choices) == 0 {
			return Message{}, errors.New("chat answer has no choice")
		}
		m, err := r.Choices[0].Message.message()
		if err != nil {
			return Message{}, fmt.Errorf("chat answer: %w", err)
		}
		m.Role = RoleAssistant
		return m, nil
	case APIAnthropicMessages:
		var r anthropicMessage
		if err := json.Unmarshal(body, &r); err != nil {
			return Message{}, fmt.Errorf("messages answer: %w", err)
		}
		if len(r.Content) == 0 {
			return Message{}, errors.New("messages answer has no content")
		}
		ms, err := r.messages()
		if err != nil || len(ms) != 1 {
			return Message{}, fmt.Errorf("messages answer: %w", errors.Join(err, errors.New("not one assistant message")))
		}
		ms[0].Role = RoleAssistant
		return ms[0], nil
	case APIOpenAIResponses:
		return responsesAnswer(body)
	case APIGeminiGenerate:
		return geminiAnswer(body)
	}
	return Message{}, fmt.Errorf("unknown API %q", api)
}
