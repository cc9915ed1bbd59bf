package gateway

import (
	"encoding/json"
	"strings"
	"testing"
)

// codexBody is a request as Codex CLI sends it (codex-rs
// ResponsesApiRequest): instructions, the whole history in input with
// store false, a reasoning item sent back with its encrypted_content,
// function, custom and local_shell tools, include, prompt_cache_key.
const codexBody = `{"model":"m","instructions":"You are Codex.","input":[` +
	`{"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions>"}]},` +
	`{"type":"message","role":"user","content":[{"type":"input_text","text":"fix it"},{"type":"input_image","image_url":"data:image/png;base64,AA"}]},` +
	`{"type":"reasoning","summary":[{"type":"summary_text","text":"look"}],"encrypted_content":"gAAAAB-opaque"},` +
	`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."}]},` +
	`{"type":"function_call","name":"shell","arguments":"{\"command\":[\"bash\",\"-lc\",\"ls\"]}","call_id":"call_1"},` +
	`{"type":"function_call_output","call_id":"call_1","output":"a.txt"},` +
	`{"type":"custom_tool_call","name":"apply_patch","input":"*** Begin Patch","call_id":"call_2"},` +
	`{"type":"custom_tool_call_output","call_id":"call_2","output":[{"type":"input_text","text":"ok"},{"type":"input_image","image_url":"data:x"}]},` +
	`{"type":"local_shell_call","call_id":"ls_1","status":"completed","action":{"type":"exec","command":["ls"]}},` +
	`{"type":"local_shell_call_output","call_id":"ls_1","output":"a.txt"}],` +
	`"tools":[{"type":"function","name":"shell","strict":false,"parameters":{"type":"object"}},` +
	`{"type":"custom","name":"apply_patch","format":{"type":"grammar","syntax":"lark","definition":"start: /.+/"}},{"type":"local_shell"}],` +
	`"tool_choice":"auto","parallel_tool_calls":false,"reasoning":{"effort":"medium","summary":"auto"},"store":false,"stream":true,` +
	`"include":["reasoning.encrypted_content"],"prompt_cache_key":"conv-1","text":{"verbosity":"low"}}`

// codex169Body has the shape of Codex CLI 0.169.0's second request of a
// turn (captured through the gateway; the text here is made up): items
// with their ids, a reasoning item with content null, exec_command and
// a namespace of sub-agent functions, client_metadata.
const codex169Body = `{"model":"m","stream":true,"tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"summary":"auto"},` +
	`"store":false,"include":["reasoning.encrypted_content"],"prompt_cache_key":"0199","client_metadata":{"session_id":"0199","turn_id":"0200"},` +
	`"input":[{"type":"message","id":"msg_1","role":"developer","content":[{"type":"input_text","text":"<permissions>"}]},` +
	`{"type":"message","id":"msg_2","role":"user","content":[{"type":"input_text","text":"What is the answer?"}]},` +
	`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"run it"}],"content":null,"encrypted_content":"gAAA"},` +
	`{"type":"message","status":"completed","id":"msg_3","role":"assistant","content":[{"type":"output_text","text":"Running."}]},` +
	`{"type":"function_call","status":"completed","id":"fc_1","name":"exec_command","arguments":"{\"cmd\":\"echo hi\"}","call_id":"call_1"},` +
	`{"type":"function_call_output","id":"fco_1","call_id":"call_1","output":"Process exited with code 0\nhi"}],` +
	`"tools":[{"type":"function","name":"exec_command","description":"Runs a command.","strict":false,"parameters":{"type":"object"}},` +
	`{"type":"function","name":"write_stdin","description":"Writes.","strict":false,"parameters":{"type":"object"}},` +
	`{"type":"namespace","name":"multi_agent_v1","description":"Sub-agents.","tools":[{"type":"function","name":"spawn_agent","description":"Spawns.","strict":false,"parameters":{"type":"object"}}]}]}`

func TestParseResponsesRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		err       string // substring; "" = accepted
		requested int64
		images    int64
		stream    bool
	}{
		{"codex", codexBody, "", 0, 2, true},
		{"codex 0.169.0", codex169Body, "", 0, 0, true},
		{"string input, bounded", `{"model":"m","input":"hi","max_output_tokens":300}`, "", 300, 0, false},
		{"easy message without type", `{"model":"m","input":[{"role":"user","content":"hi"}],"store":true}`, "", 0, 0, false},
		{"previous response", `{"model":"m","input":"hi","previous_response_id":"resp_1"}`, "previous_response_id", 0, 0, false},
		{"conversation", `{"model":"m","input":"hi","conversation":"conv_1"}`, "conversation", 0, 0, false},
		{"stored prompt", `{"model":"m","prompt":{"id":"pmpt_1"}}`, "prompt", 0, 0, false},
		{"background", `{"model":"m","input":"hi","background":true}`, "background", 0, 0, false},
		{"web search", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f"},{"type":"web_search","external_web_access":false}]}`, `tools[1]: type "web_search"`, 0, 0, false},
		{"image generation", `{"model":"m","input":"hi","tools":[{"type":"image_generation"}]}`, `type "image_generation"`, 0, 0, false},
		{"namespace of functions", `{"model":"m","input":"hi","tools":[{"type":"namespace","name":"multi_agent_v1","tools":[{"type":"function","name":"spawn_agent"}]}]}`, "", 0, 0, false},
		{"namespace with a provider's tool", `{"model":"m","input":"hi","tools":[{"type":"namespace","name":"x","tools":[{"type":"function","name":"f"},{"type":"web_search"}]}]}`, `tools[0].tools[1]: type "web_search"`, 0, 0, false},
		{"item reference", `{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}`, `item type "item_reference"`, 0, 0, false},
		{"a provider tool's item", `{"model":"m","input":[{"type":"web_search_call","action":{}}]}`, `item type "web_search_call"`, 0, 0, false},
		{"file part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, `part type "input_file"`, 0, 0, false},
		{"file in a tool output", `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_file"}]}]}`, `input[0]: content[0]`, 0, 0, false},
		{"priority tier", `{"model":"m","input":"hi","service_tier":"priority"}`, "service_tier", 0, 0, false},
		{"zero bound", `{"model":"m","input":"hi","max_output_tokens":0}`, "max_output_tokens 0", 0, 0, false},
		{"no input", `{"model":"m"}`, "input is required", 0, 0, false},
		{"empty input", `{"model":"m","input":[]}`, "0 items", 0, 0, false},
		{"empty string", `{"model":"m","input":""}`, "input is empty", 0, 0, false},
		{"no model", `{"input":"hi"}`, "model is required", 0, 0, false},
		{"store not a bool", `{"model":"m","input":"hi","store":"yes"}`, "store", 0, 0, false},
		{"null", `null`, "null", 0, 0, false},
	} {
		r, err := parseResponsesRequest([]byte(tc.body))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || r.Requested != tc.requested || r.Images != tc.images || r.Stream != tc.stream || r.Choices != 1 || !r.IncludeUsage || r.Model != "m" {
			t.Errorf("%s: %+v, %v", tc.name, r, err)
		}
	}
}

func TestRewriteResponses(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"codex", codexBody},
		{"client bound and store true", `{"model":"m","input":"a < b && c","max_output_tokens":90000,"store":true}`},
	} {
		r, err := parseResponsesRequest([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		out, err := rewriteResponses(r, "up-2026", 512)
		if err != nil {
			t.Fatal(err)
		}
		var in, got map[string]json.RawMessage
		_ = json.Unmarshal([]byte(tc.body), &in)
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if string(got["model"]) != `"up-2026"` || string(got["max_output_tokens"]) != "512" || string(got["store"]) != "false" {
			t.Errorf("%s: model %s, max_output_tokens %s, store %s", tc.name, got["model"], got["max_output_tokens"], got["store"])
		}
		for k, v := range in {
			if k == "model" || k == "max_output_tokens" || k == "store" {
				continue
			}
			if string(got[k]) != string(v) {
				t.Errorf("%s: field %s changed: %s -> %s", tc.name, k, v, got[k])
			}
		}
		if strings.Contains(string(out), `\u003c`) {
			t.Errorf("%s: text was HTML-escaped: %s", tc.name, out)
		}
	}
}

func TestResponsesUsage(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Usage
		found      bool
		err        string
	}{
		{"cached and reasoning", `{"usage":{"input_tokens":1200,"input_tokens_details":{"cached_tokens":1000},"output_tokens":300,"output_tokens_details":{"reasoning_tokens":250},"total_tokens":1500}}`,
			Usage{Input: 1200, CachedInput: 1000, Output: 300}, true, ""},
		{"reasoning beyond output", `{"usage":{"input_tokens":10,"output_tokens":5,"output_tokens_details":{"reasoning_tokens":40}}}`,
			Usage{Input: 10, Output: 40}, true, ""},
		{"no details", `{"usage":{"input_tokens":10,"output_tokens":5}}`, Usage{Input: 10, Output: 5}, true, ""},
		{"no usage", `{"id":"resp_1","output":[]}`, Usage{}, false, ""},
		{"null usage", `{"usage":null}`, Usage{}, false, ""},
		{"lacks output", `{"usage":{"input_tokens":10}}`, Usage{}, false, "lacks"},
		{"more cached than input", `{"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":11},"output_tokens":1}}`, Usage{}, false, "exceed"},
		{"negative reasoning", `{"usage":{"input_tokens":10,"output_tokens":1,"output_tokens_details":{"reasoning_tokens":-1}}}`, Usage{}, false, "negative"},
		{"not JSON", `{`, Usage{}, false, "not a JSON object"},
	} {
		u, found, err := parseResponsesResponse([]byte(tc.body))
		if u != tc.want || found != tc.found || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %+v %v %v, want %+v %v %q", tc.name, u, found, err, tc.want, tc.found, tc.err)
		}
	}
}

// responsesStream is a Responses stream as OpenAI sends it: a reasoning
// item, a message, a function call, then response.completed with the
// whole response and its usage.
const responsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","model":"m","output":[],"usage":null}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"in_progress","model":"m","output":[],"usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[]}}

event: response.reasoning_summary_text.delta
data: {"type":"response.reasoning_summary_text.delta","sequence_number":3,"item_id":"rs_1","output_index":0,"summary_index":0,"delta":"think"}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":4,"output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think"}],"encrypted_content":"gAAA"}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":5,"output_index":1,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}

event: response.content_part.added
data: {"type":"response.content_part.added","sequence_number":6,"item_id":"msg_1","output_index":1,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_1","output_index":1,"content_index":0,"delta":"Hello"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":8,"item_id":"msg_1","output_index":1,"content_index":0,"delta":" world"}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":9,"output_index":2,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"shell","arguments":"","status":"in_progress"}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":10,"item_id":"fc_1","output_index":2,"delta":"{\"command\":"}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":11,"item_id":"fc_1","output_index":2,"delta":"[\"ls\"]}"}

event: response.completed
data: {"type":"response.completed","sequence_number":12,"response":{"id":"resp_1","object":"response","status":"completed","model":"m","output":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think"}],"encrypted_content":"gAAA"},{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello world","annotations":[]}]},{"type":"function_call","id":"fc_1","call_id":"call_1","name":"shell","arguments":"{\"command\":[\"ls\"]}","status":"completed"}],"usage":{"input_tokens":900,"input_tokens_details":{"cached_tokens":800},"output_tokens":40,"output_tokens_details":{"reasoning_tokens":30},"total_tokens":940}}}

`

func TestResponsesAssembler(t *testing.T) {
	a := &responsesAssembler{}
	feed(t, a, []byte(responsesStream))
	u, found, err := a.Usage()
	if !a.Complete() || !found || err != nil || u != (Usage{Input: 900, CachedInput: 800, Output: 40}) {
		t.Fatalf("complete %v, usage %+v %v %v", a.Complete(), u, found, err)
	}
	final := responsesStream[strings.Index(responsesStream, `"response":{"id":"resp_1","object":"response","status":"completed"`)+len(`"response":`):]
	final = final[:strings.LastIndex(final, "}")]
	var want, got any
	_ = json.Unmarshal([]byte(final), &want)
	if err := json.Unmarshal(a.Response(), &got); err != nil {
		t.Fatal(err)
	}
	if w, _ := json.Marshal(want); string(w) != string(mustJSON(got)) {
		t.Fatalf("answer\n%s\nwant the completed response\n%s", a.Response(), w)
	}

	// A stream whose final response has no output (some compatible
	// servers) gets the streamed items; one cut before its final event
	// has no usage and the items so far.
	noOutput := strings.Replace(responsesStream, `"status":"completed","model":"m","output":[{"type":"reasoning"`, `"status":"completed","model":"m","output":[],"x":[{"type":"reasoning"`, 1)
	cut := responsesStream[:strings.Index(responsesStream, "event: response.completed")]
	for name, tc := range map[string]struct {
		stream   string
		complete bool
		status   string
	}{"no output": {noOutput, true, "completed"}, "cut": {cut, false, "in_progress"}} {
		a := &responsesAssembler{}
		feed(t, a, []byte(tc.stream))
		_, found, _ := a.Usage()
		if a.Complete() != tc.complete || found != tc.complete {
			t.Errorf("%s: complete %v, usage found %v", name, a.Complete(), found)
		}
		var r struct {
			Status string `json:"status"`
			Output []struct {
				Type      string `json:"type"`
				Status    string `json:"status"`
				Arguments string `json:"arguments"`
				Encrypted string `json:"encrypted_content"`
				Content   []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"output"`
		}
		if err := json.Unmarshal(a.Response(), &r); err != nil || r.Status != tc.status || len(r.Output) != 3 {
			t.Fatalf("%s: %s", name, a.Response())
		}
		if r.Output[0].Encrypted != "gAAA" || r.Output[1].Content[0].Text != "Hello world" || r.Output[1].Status != "incomplete" ||
			r.Output[2].Arguments != `{"command":["ls"]}` {
			t.Errorf("%s: items %+v", name, r.Output)
		}
		if texts := responsesTexts(a.Response()); len(texts) != 1 || texts[0] != "Hello world" {
			t.Errorf("%s: texts %q", name, texts)
		}
	}

	// Token: what carries output; Done: the final event.
	for _, tc := range []struct {
		data        string
		token, done bool
	}{
		{`{"type":"response.output_text.delta","delta":"x"}`, true, false},
		{`{"type":"response.function_call_arguments.delta","delta":"{"}`, true, false},
		{`{"type":"response.reasoning_summary_text.delta","delta":"x"}`, true, false},
		{`{"type":"response.created","response":{}}`, false, false},
		{`{"type":"response.incomplete","response":{"status":"incomplete","usage":{"input_tokens":1,"output_tokens":16}}}`, false, true},
		{`{"type":"response.failed","response":{"status":"failed","usage":null}}`, false, true},
	} {
		info, err := (&responsesAssembler{}).Event([]byte(tc.data))
		if err != nil || info.Token != tc.token || info.Done != tc.done {
			t.Errorf("%s: %+v %v", tc.data, info, err)
		}
	}
	for _, bad := range []string{`{"type":"response.output_text.delta","output_index":-1}`, `{"type":"response.output_item.added","output_index":5000}`,
		`{"type":"response.content_part.added","content_index":99}`, `{"type":"response.completed","response":{"usage":5}}`, `[`} {
		if _, err := (&responsesAssembler{}).Event([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func FuzzResponsesStream(f *testing.F) {
	f.Add([]byte(responsesStream))
	f.Add([]byte("data: {\"type\":\"response.output_text.delta\",\"output_index\":99999999}\n\n"))
	f.Add([]byte("data: {\"type\":\"error\",\"message\":\"overloaded\"}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) { feed(t, &responsesAssembler{}, b) })
}

func FuzzResponsesRequest(f *testing.F) {
	f.Add([]byte(codexBody))
	f.Add([]byte(codex169Body))
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_image"}]}],"max_output_tokens":5,"store":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseResponsesRequest(b)
		if err != nil {
			return
		}
		if r.Model == "" || r.Choices != 1 || r.Requested < 0 || r.Images < 0 {
			t.Fatalf("accepted %q as %+v", b, r)
		}
		out, err := rewriteResponses(r, "up", 7)
		if err != nil {
			return
		}
		again, err := parseResponsesRequest(out)
		var store bool
		if err == nil {
			err = json.Unmarshal(again.fields["store"], &store)
		}
		if err != nil || again.Model != "up" || again.Requested != 7 || again.Images != r.Images || store {
			t.Fatalf("rewrite of %q gives %q: %+v, %v", b, out, again, err)
		}
	})
}

func FuzzResponsesUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":30},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":5}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, found, err := parseResponsesResponse(b)
		if found && (err != nil || u.Validate() != nil) {
			t.Fatalf("%q: usage %+v found with error %v", b, u, err)
		}
	})
}

// BenchmarkResponsesAssemblerDelta is the gateway's work on the most
// common event of a Responses stream.
//
//	go test -run '^$' -bench ResponsesAssemblerDelta ./gateway/
func BenchmarkResponsesAssemblerDelta(b *testing.B) {
	ev := []byte(`{"content_index":0,"delta":" tok","item_id":"msg_0123456789abcdef01234567","logprobs":[],"output_index":1,"sequence_number":1234,"type":"response.output_text.delta"}`)
	a := &responsesAssembler{}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Event(ev); err != nil {
			b.Fatal(err)
		}
	}
}
