package verify_test

import (
	"encoding/json"
	"fmt"

	"github.com/repronet/repronet/verify"
)

// msg is a chat message as the reference agent sends it.
type msg struct {
	Role       string `json:"role"`
	Content    string `json:"content"`
	ToolCalls  []call `json:"tool_calls,omitempty"`
	ToolCallID string `json:"tool_call_id,omitempty"`
}

type call struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func toolCall(id, name, args string) call {
	c := call{ID: id, Type: "function"}
	c.Function.Name, c.Function.Arguments = name, args
	return c
}

// run is an agent's run as the reference agent makes it: the model asks
// for each command in turn (bash), the agent answers with its output, and
// the model submits answers.
type run struct {
	commands []string
	outputs  []string // outputs[i] answers commands[i]
	submit   string   // the submit call's arguments
}

func request(msgs []msg) []byte {
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

func answer(m msg) []byte {
	b, _ := json.Marshal(map[string]any{"id": "x", "object": "chat.completion",
		"choices": []any{map[string]any{"index": 0, "message": m, "finish_reason": "tool_calls"}}})
	return b
}

// exchanges are the run's model calls: one per command, one to submit.
func (r run) exchanges() []verify.Exchange {
	msgs := []msg{{Role: "system", Content: "You are an agent."}, {Role: "user", Content: "Reproduce the paper."}}
	var out []verify.Exchange
	for i := 0; i <= len(r.commands); i++ {
		var reply msg
		if i < len(r.commands) {
			reply = msg{Role: "assistant", ToolCalls: []call{toolCall(fmt.Sprintf("call_%d", i), "bash",
				fmt.Sprintf(`{"command": %q}`, r.commands[i]))}}
		} else {
			reply = msg{Role: "assistant", ToolCalls: []call{toolCall(fmt.Sprintf("call_%d", i), "submit", r.submit)}}
		}
		out = append(out, verify.Exchange{API: verify.APIOpenAIChat, Request: request(msgs), Response: answer(reply)})
		msgs = append(msgs, reply)
		if i < len(r.commands) {
			msgs = append(msgs, msg{Role: "tool", ToolCallID: fmt.Sprintf("call_%d", i), Content: r.outputs[i]})
		}
	}
	return out
}

// with returns a copy of r with output i replaced.
func (r run) with(i int, output string) run {
	r.outputs = append([]string(nil), r.outputs...)
	r.outputs[i] = output
	return r
}

func answers(kv ...string) []verify.Answer {
	var out []verify.Answer
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, verify.Answer{Name: kv[i], Value: json.RawMessage(kv[i+1])})
	}
	return out
}
