package verify

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// This file reads the messages of OpenAI's Responses API and Gemini's
// generateContent, as messages.go reads chat completions and Anthropic's
// Messages: who spoke, the text, the tool calls made or answered.
// Reasoning items and thought parts are not read (the provider shows them
// to the model itself, signed or encrypted).

// APIs of recorded exchanges read here (the gateway's call names).
const (
	APIOpenAIResponses = "openai.responses"
	APIGeminiGenerate  = "gemini.generateContent"
)

// APIs that only count a prompt's tokens (the gateway's call names): not
// turns of a conversation. Their requests are read as one message of
// their canonical JSON (so that a replay pairs them by content) and their
// answers as none (a count binds no answer).
const (
	APIGeminiCountTokens    = "gemini.countTokens"
	APIAnthropicCountTokens = "anthropic.count_tokens"
)

// counting reports whether api only counts tokens.
func counting(api string) bool { return api == APIGeminiCountTokens || api == APIAnthropicCountTokens }

// responsesItem is an item of a Responses input or output.
type responsesItem struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Input     json.RawMessage `json:"input"`
	Action    json.RawMessage `json:"action"`
	Output    json.RawMessage `json:"output"`
}

// responsesMessages reads Responses items: consecutive items of the model
// (its messages and tool calls) make one assistant message, each tool
// output a tool message.
func responsesMessages(items []json.RawMessage) ([]Message, error) {
	var out []Message
	var turn *Message // the assistant message being read
	flush := func() {
		if turn != nil {
			out = append(out, *turn)
			turn = nil
		}
	}
	model := func() *Message {
		if turn == nil {
			turn = &Message{Role: RoleAssistant}
		}
		return turn
	}
	for i, raw := range items {
		var it responsesItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		switch it.Type {
		case "", "message":
			text, others, err := contentText(it.Content)
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			for _, o := range others {
				text += "\n" + canonicalJSON(o)
			}
			if it.Role == RoleAssistant {
				model().Text += text
				continue
			}
			flush()
			role := it.Role
			if role == "developer" {
				role = RoleSystem
			}
			out = append(out, Message{Role: role, Text: text})
		case "reasoning":
		case "function_call":
			m := model()
			m.Calls = append(m.Calls, ToolCall{ID: it.CallID, Name: it.Name, Args: canonicalJSON([]byte(it.Arguments))})
		case "custom_tool_call":
			var s string
			if json.Unmarshal(it.Input, &s) != nil {
				s = canonicalJSON(it.Input)
			}
			m := model()
			m.Calls = append(m.Calls, ToolCall{ID: it.CallID, Name: it.Name, Args: s})
		case "local_shell_call":
			m := model()
			m.Calls = append(m.Calls, ToolCall{ID: it.CallID, Name: "local_shell", Args: canonicalJSON(it.Action)})
		case "function_call_output", "custom_tool_call_output", "local_shell_call_output":
			flush()
			text, others, err := contentText(it.Output)
			if err != nil {
				return nil, fmt.Errorf("item %d: output: %w", i, err)
			}
			for _, o := range others {
				text += "\n" + canonicalJSON(o)
			}
			id := it.CallID
			if id == "" {
				id = it.ID
			}
			out = append(out, Message{Role: RoleTool, CallID: id, Text: text})
		default:
			flush()
			out = append(out, Message{Role: RoleUser, Text: canonicalJSON(raw)})
		}
	}
	flush()
	return out, nil
}

func responsesRequest(body []byte) ([]Message, error) {
	var r struct {
		Instructions json.RawMessage `json:"instructions"`
		Input        json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("responses request: %w", err)
	}
	var out []Message
	if len(r.Instructions) > 0 && string(r.Instructions) != "null" {
		text, _, err := contentText(r.Instructions)
		if err != nil {
			return nil, fmt.Errorf("responses request: instructions: %w", err)
		}
		out = append(out, Message{Role: RoleSystem, Text: text})
	}
	var s string
	if json.Unmarshal(r.Input, &s) == nil {
		return append(out, Message{Role: RoleUser, Text: s}), nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(r.Input, &items); err != nil {
		return nil, errors.New("responses request: input is neither a string nor a list of items")
	}
	ms, err := responsesMessages(items)
	if err != nil {
		return nil, fmt.Errorf("responses request: input %w", err)
	}
	return append(out, ms...), nil
}

func responsesAnswer(body []byte) (Message, error) {
	var r struct {
		Output []json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return Message{}, fmt.Errorf("responses answer: %w", err)
	}
	ms, err := responsesMessages(r.Output)
	if err != nil {
		return Message{}, fmt.Errorf("responses answer: output %w", err)
	}
	m := Message{Role: RoleAssistant}
	for _, x := range ms {
		if x.Role != RoleAssistant {
			return Message{}, errors.New("responses answer: output holds a message that is not the model's")
		}
		m.Text += x.Text
		m.Calls = append(m.Calls, x.Calls...)
	}
	return m, nil
}

// geminiContent is a Content of Gemini's API.
type geminiContent struct {
	Role  string                       `json:"role"`
	Parts []map[string]json.RawMessage `json:"parts"`
}

// messages reads a Content: the model's into one assistant message, a
// user's into a tool message per function response and a user message
// for the rest.
func (c geminiContent) messages() ([]Message, error) {
	role := c.Role
	switch role {
	case "model":
		role = RoleAssistant
	case "", "function":
		role = RoleUser
	}
	m := Message{Role: role}
	var tools []Message
	for j, p := range c.Parts {
		var thought bool
		_ = json.Unmarshal(p["thought"], &thought)
		switch {
		case p["functionCall"] != nil:
			var fc struct {
				ID   string          `json:"id"`
				Name string          `json:"name"`
				Args json.RawMessage `json:"args"`
			}
			if err := json.Unmarshal(p["functionCall"], &fc); err != nil {
				return nil, fmt.Errorf("parts[%d].functionCall: %w", j, err)
			}
			m.Calls = append(m.Calls, ToolCall{ID: fc.ID, Name: fc.Name, Args: canonicalJSON(fc.Args)})
		case p["functionResponse"] != nil:
			var fr struct {
				ID       string          `json:"id"`
				Name     string          `json:"name"`
				Response json.RawMessage `json:"response"`
			}
			if err := json.Unmarshal(p["functionResponse"], &fr); err != nil {
				return nil, fmt.Errorf("parts[%d].functionResponse: %w", j, err)
			}
			id := fr.ID
			if id == "" {
				id = fr.Name
			}
			tools = append(tools, Message{Role: RoleTool, CallID: id, Text: canonicalJSON(fr.Response)})
		case thought:
		case p["text"] != nil:
			var s string
			if err := json.Unmarshal(p["text"], &s); err != nil {
				return nil, fmt.Errorf("parts[%d].text: %w", j, err)
			}
			m.Text += s
		default:
			delete(p, "thoughtSignature")
			if len(p) > 0 {
				raw, _ := json.Marshal(p)
				m.Text += "\n" + canonicalJSON(raw)
			}
		}
	}
	if m.Text != "" || len(m.Calls) > 0 || len(tools) == 0 {
		tools = append(tools, m)
	}
	return tools, nil
}

func geminiRequest(body []byte) ([]Message, error) {
	var r struct {
		SystemInstruction *geminiContent  `json:"systemInstruction"`
		Contents          []geminiContent `json:"contents"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("gemini request: %w", err)
	}
	var out []Message
	if r.SystemInstruction != nil {
		ms, err := r.SystemInstruction.messages()
		if err != nil {
			return nil, fmt.Errorf("gemini request: systemInstruction.%w", err)
		}
		var b strings.Builder
		for _, m := range ms {
			b.WriteString(m.Text)
		}
		out = append(out, Message{Role: RoleSystem, Text: b.String()})
	}
	for i, c := range r.Contents {
		ms, err := c.messages()
		if err != nil {
			return nil, fmt.Errorf("gemini request: contents[%d].%w", i, err)
		}
		out = append(out, ms...)
	}
	return out, nil
}

func geminiAnswer(body []byte) (Message, error) {
	var r struct {
		Candidates []struct {
			Content geminiContent `json:"content"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return Message{}, fmt.Errorf("gemini answer: %w", err)
	}
	if len(r.Candidates) == 0 {
		return Message{}, errors.New("gemini answer has no candidate")
	}
	c := r.Candidates[0].Content
	c.Role = "model"
	ms, err := c.messages()
	if err != nil || len(ms) != 1 {
		return Message{}, fmt.Errorf("gemini answer: %w", errors.Join(err, errors.New("not one model message")))
	}
	return ms[0], nil
}
