package verify

import (
	"encoding/json"
	"errors"
	"fmt"
)

// APIGeminiGenerate is Gemini's generateContent (and its stream, recorded
// as the answer it amounts to), as the gateway names its calls.
const APIGeminiGenerate = "gemini.generateContent"

// geminiContent is a Gemini Content: a role (user or model) and parts.
type geminiContent struct {
	Role  string                       `json:"role"`
	Parts []map[string]json.RawMessage `json:"parts"`
}

// messages reads a content into messages: a model turn is one assistant
// message (its text parts and functionCall parts); a user turn's
// functionResponse parts are a tool message each (answering the call of
// the same id, else of the same name), its other parts a user message
// after them. Thought parts are left out (Gemini does not read them as
// text again, as Anthropic's thinking blocks); other parts are named by
// their canonical JSON, so that a change of them is seen.
func (c geminiContent) messages() ([]Message, error) {
	role := RoleUser
	switch c.Role {
	case "model":
		role = RoleAssistant
	case "user", "", "function", "tool":
	default:
		return nil, fmt.Errorf("unknown role %q", c.Role)
	}
	var out []Message
	m := Message{Role: role}
	for i, p := range c.Parts {
		if t, ok := p["thought"]; ok && string(t) == "true" {
			continue
		}
		switch {
		case p["text"] != nil:
			var s string
			if err := json.Unmarshal(p["text"], &s); err != nil {
				return nil, fmt.Errorf("part %d: text: %w", i, err)
			}
			m.Text += s
		case p["functionCall"] != nil:
			var fc struct {
				ID   string          `json:"id"`
				Name string          `json:"name"`
				Args json.RawMessage `json:"args"`
			}
			if err := json.Unmarshal(p["functionCall"], &fc); err != nil {
				return nil, fmt.Errorf("part %d: functionCall: %w", i, err)
			}
			m.Calls = append(m.Calls, ToolCall{ID: cmpOr(fc.ID, fc.Name), Name: fc.Name, Args: canonicalJSON(fc.Args)})
		case p["functionResponse"] != nil:
			var fr struct {
				ID       string          `json:"id"`
				Name     string          `json:"name"`
				Response json.RawMessage `json:"response"`
			}
			if err := json.Unmarshal(p["functionResponse"], &fr); err != nil {
				return nil, fmt.Errorf("part %d: functionResponse: %w", i, err)
			}
			out = append(out, Message{Role: RoleTool, CallID: cmpOr(fr.ID, fr.Name), Text: toolText(fr.Response)})
		default:
			other := map[string]json.RawMessage{}
			for k, v := range p {
				if k != "thoughtSignature" {
					other[k] = v
				}
			}
			if len(other) > 0 {
				raw, _ := json.Marshal(other)
				m.Text += "\n" + canonicalJSON(raw)
			}
		}
	}
	if m.Text != "" || len(m.Calls) > 0 || len(out) == 0 {
		out = append(out, m)
	}
	return out, nil
}

// toolText is a function response's text: its output or result when it
// is a string (as Gemini CLI sends a command's output), else its
// canonical JSON.
func toolText(resp json.RawMessage) string {
	var r map[string]json.RawMessage
	if json.Unmarshal(resp, &r) == nil && len(r) == 1 {
		for _, k := range []string{"output", "result", "content"} {
			var s string
			if v, ok := r[k]; ok && json.Unmarshal(v, &s) == nil {
				return s
			}
		}
	}
	return canonicalJSON(resp)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// geminiRequestMessages reads the conversation a generateContent request
// shows the model: the system instruction, then the contents.
func geminiRequestMessages(body []byte) ([]Message, error) {
	var r struct {
		SystemInstruction *geminiContent  `json:"systemInstruction"`
		Contents          []geminiContent `json:"contents"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("generateContent request: %w", err)
	}
	var out []Message
	if r.SystemInstruction != nil {
		ms, err := r.SystemInstruction.messages()
		if err != nil {
			return nil, fmt.Errorf("generateContent request: systemInstruction: %w", err)
		}
		for _, m := range ms {
			m.Role = RoleSystem
			out = append(out, m)
		}
	}
	for i, c := range r.Contents {
		ms, err := c.messages()
		if err != nil {
			return nil, fmt.Errorf("generateContent request: content %d: %w", i, err)
		}
		out = append(out, ms...)
	}
	return out, nil
}

// geminiResponseMessage reads the assistant message of an answer (its
// first candidate).
func geminiResponseMessage(body []byte) (Message, error) {
	var r struct {
		Candidates []struct {
			Content geminiContent `json:"content"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return Message{}, fmt.Errorf("generateContent answer: %w", err)
	}
	if len(r.Candidates) == 0 {
		return Message{}, errors.New("generateContent answer has no candidate")
	}
	c := r.Candidates[0].Content
	c.Role = "model"
	ms, err := c.messages()
	if err != nil || len(ms) != 1 {
		return Message{}, fmt.Errorf("generateContent answer: %w", errors.Join(err, errors.New("not one model message")))
	}
	return ms[0], nil
}
