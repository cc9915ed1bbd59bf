package dashboard

import (
	"encoding/json"
	"strings"

	"github.com/repronet/repronet/verify"
)

// Reading model calls: the OpenAI chat completions and Anthropic messages
// bodies a trajectory records, turned into messages a person can read. A
// body that is neither reads as nothing (its raw form is shown instead).

// CallMessages reads a call's request and answer by the call's API (the
// gateway's call names): chat completions and Anthropic's Messages as
// RequestMessages and ResponseMessages do; OpenAI's Responses API and
// Gemini's generateContent through package verify's readers, which read
// them as the replay does. A body it cannot read reads as nothing.
func CallMessages(api string, req, resp []byte) (request, response []Message) {
	if api != verify.APIOpenAIResponses && api != verify.APIGeminiGenerate {
		return RequestMessages(req), ResponseMessages(resp)
	}
	conv := func(m verify.Message) Message {
		out := Message{Role: m.Role, Content: m.Text}
		for _, c := range m.Calls {
			out.ToolCalls = append(out.ToolCalls, ToolCall{Name: c.Name, Arguments: c.Args})
		}
		return out
	}
	if ms, err := verify.RequestMessages(api, req); err == nil {
		for _, m := range ms {
			request = append(request, conv(m))
		}
	}
	if len(resp) > 0 {
		if m, err := verify.ResponseMessage(api, resp); err == nil {
			response = []Message{conv(m)}
		}
	}
	return request, response
}

// RequestMessages reads the messages of a request body: Anthropic's
// system prompt first, then each message.
func RequestMessages(body []byte) []Message {
	var req struct {
		System   json.RawMessage `json:"system"`
		Messages []rawMessage    `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return nil
	}
	var out []Message
	if s := readContent(req.System); s != "" {
		out = append(out, Message{Role: "system", Content: s})
	}
	for _, m := range req.Messages {
		out = append(out, m.read())
	}
	return out
}

// ResponseMessages reads the answer of a response body: OpenAI's choices,
// or Anthropic's content blocks.
func ResponseMessages(body []byte) []Message {
	var resp struct {
		Choices []struct {
			Message rawMessage `json:"message"`
		} `json:"choices"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(body, &resp) != nil {
		return nil
	}
	var out []Message
	for _, c := range resp.Choices {
		out = append(out, c.Message.read())
	}
	if len(resp.Choices) == 0 && len(resp.Content) > 0 {
		out = append(out, rawMessage{Role: resp.Role, Content: resp.Content}.read())
	}
	return out
}

// rawMessage is a message of either API.
type rawMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

func (m rawMessage) read() Message {
	out := Message{Role: m.Role, Content: readContent(m.Content)}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, ToolCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	var blocks []struct {
		Type  string          `json:"type"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(m.Content, &blocks) == nil {
		for _, b := range blocks {
			if b.Type == "tool_use" {
				out.ToolCalls = append(out.ToolCalls, ToolCall{Name: b.Name, Arguments: string(b.Input)})
			}
		}
	}
	return out
}

// readContent reads a content field: a string, or parts or blocks with
// text (tool results' content read the same way).
func readContent(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return string(raw)
	}
	var texts []string
	for _, p := range parts {
		switch {
		case p.Text != "":
			texts = append(texts, p.Text)
		case p.Type == "tool_result":
			texts = append(texts, "[tool result] "+readContent(p.Content))
		case p.Type == "image_url" || p.Type == "image":
			texts = append(texts, "[image]")
		}
	}
	return strings.Join(texts, "\n")
}
