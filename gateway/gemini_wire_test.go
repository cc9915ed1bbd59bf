package gateway

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseGeminiPath(t *testing.T) {
	for _, tc := range []struct {
		path, model, method, err string
	}{
		{"/v1beta/models", "", "", ""},
		{"/v1beta/models/", "", "", ""},
		{"/v1beta/models/gemini-2.5-pro", "gemini-2.5-pro", "", ""},
		{"/v1beta/models/gemini-2.5-pro:generateContent", "gemini-2.5-pro", "generateContent", ""},
		{"/v1beta/models/org/m:streamGenerateContent", "org/m", "streamGenerateContent", ""},
		{"/v1beta/models/:countTokens", "", "", "no model"},
		{"/v1beta/modelsx", "", "", "no endpoint"},
		{"/v1/models", "", "", "no endpoint"},
	} {
		m, meth, err := parseGeminiPath(tc.path)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.path, err, tc.err)
			}
			continue
		}
		if err != nil || m != tc.model || meth != tc.method {
			t.Errorf("%s: %q %q %v, want %q %q", tc.path, m, meth, err, tc.model, tc.method)
		}
	}
}

// geminiUser is a contents list with one user turn.
const geminiUser = `"contents":[{"role":"user","parts":[{"text":"hi"}]}]`

func TestParseGeminiRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		err       string // substring; "" = accepted
		requested int64
		choices   int64
		images    int64
	}{
		{"minimal", `{` + geminiUser + `}`, "", 0, 1, 0},
		{"bound, candidates and images", `{"contents":[{"role":"user","parts":[{"text":"see"},{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]},
			{"role":"model","parts":[{"functionCall":{"name":"read_file","args":{"file_path":"a.png"}}}]},
			{"role":"user","parts":[{"functionResponse":{"name":"read_file","response":{"output":"ok"},"parts":[{"inlineData":{"mimeType":"image/jpeg","data":"AA"}}]}}]}],
			"systemInstruction":{"parts":[{"text":"sys"}]},"generationConfig":{"maxOutputTokens":500,"candidateCount":2}}`, "", 500, 2, 2},
		{"function tools and text data", `{` + geminiUser + `,"tools":[{"functionDeclarations":[{"name":"run_shell_command"}]}],
			"contents":[{"parts":[{"inlineData":{"mimeType":"text/plain","data":"AA"}},{"text":"x","thought":true,"thoughtSignature":"c2ln"}]}]}`, "", 0, 1, 0},
		{"google search", `{` + geminiUser + `,"tools":[{"functionDeclarations":[]},{"googleSearch":{}}]}`, "tools[1]: googleSearch is not supported", 0, 0, 0},
		{"code execution", `{` + geminiUser + `,"tools":[{"codeExecution":{}}]}`, "codeExecution is not supported", 0, 0, 0},
		{"url context", `{` + geminiUser + `,"tools":[{"urlContext":{}}]}`, "urlContext is not supported", 0, 0, 0},
		{"unknown tool", `{` + geminiUser + `,"tools":[{"newThing":{}}]}`, "newThing is not supported", 0, 0, 0},
		{"cached content", `{` + geminiUser + `,"cachedContent":"cachedContents/abc"}`, "cachedContent is not supported", 0, 0, 0},
		{"file data", `{"contents":[{"parts":[{"fileData":{"fileUri":"https://x/files/1","mimeType":"video/mp4"}}]}]}`, "contents[0].parts[0]: fileData is not supported", 0, 0, 0},
		{"inline audio", `{"contents":[{"parts":[{"inlineData":{"mimeType":"audio/wav","data":"AA"}}]}]}`, `inlineData of type "audio/wav"`, 0, 0, 0},
		{"inline pdf in a function response", `{"contents":[{"parts":[{"functionResponse":{"name":"f","parts":[{"inlineData":{"mimeType":"application/pdf"}}]}}]}]}`, "functionResponse.parts[0]", 0, 0, 0},
		{"audio output", `{` + geminiUser + `,"generationConfig":{"responseModalities":["TEXT","AUDIO"]}}`, `"AUDIO" is not supported`, 0, 0, 0},
		{"speech", `{` + geminiUser + `,"generationConfig":{"speechConfig":{}}}`, "speechConfig", 0, 0, 0},
		{"zero bound", `{` + geminiUser + `,"generationConfig":{"maxOutputTokens":0}}`, "below 1", 0, 0, 0},
		{"too many candidates", `{` + geminiUser + `,"generationConfig":{"candidateCount":17}}`, "candidateCount 17", 0, 0, 0},
		{"no contents", `{"contents":[]}`, "contents is required", 0, 0, 0},
		{"not an object", `[1]`, "not a JSON object", 0, 0, 0},
		{"null", `null`, "null", 0, 0, 0},
	} {
		r, err := parseGeminiRequest([]byte(tc.body), "gm", true)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if r.Model != "gm" || !r.Stream || r.Requested != tc.requested || r.Choices != tc.choices || r.Images != tc.images {
			t.Errorf("%s: %+v, want requested %d, choices %d, images %d", tc.name, r, tc.requested, tc.choices, tc.images)
		}
	}
}

func TestRewriteGemini(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		maxOut     int64
		budget     any // thinkingBudget forwarded; nil: none
	}{
		{"bound set", `{` + geminiUser + `}`, 100, nil},
		{"bound lowered", `{` + geminiUser + `,"generationConfig":{"maxOutputTokens":9000,"temperature":0.5}}`, 100, nil},
		{"thinking budget over the bound", `{` + geminiUser + `,"generationConfig":{"thinkingConfig":{"thinkingBudget":8192,"includeThoughts":true}}}`, 100, float64(99)},
		{"thinking budget under the bound", `{` + geminiUser + `,"generationConfig":{"thinkingConfig":{"thinkingBudget":50}}}`, 100, float64(50)},
		{"dynamic thinking", `{` + geminiUser + `,"generationConfig":{"thinkingConfig":{"thinkingBudget":-1}}}`, 100, float64(-1)},
	} {
		r, err := parseGeminiRequest([]byte(tc.body), "gm", false)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		out, err := rewriteGemini(r, "gemini-up", tc.maxOut)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got struct {
			Contents         json.RawMessage `json:"contents"`
			GenerationConfig map[string]any  `json:"generationConfig"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		gc := got.GenerationConfig
		if gc["maxOutputTokens"] != float64(tc.maxOut) || string(got.Contents) != `[{"role":"user","parts":[{"text":"hi"}]}]` {
			t.Errorf("%s: forwarded %s", tc.name, out)
		}
		var budget any
		if tc, ok := gc["thinkingConfig"].(map[string]any); ok {
			budget = tc["thinkingBudget"]
		}
		if budget != tc.budget {
			t.Errorf("%s: thinkingBudget %v, want %v (%s)", tc.name, budget, tc.budget, out)
		}
		if strings.Contains(tc.body, "temperature") && gc["temperature"] != 0.5 {
			t.Errorf("%s: other settings lost: %s", tc.name, out)
		}
	}
	// A model named in the body becomes the upstream's.
	r, _ := parseGeminiRequest([]byte(`{"model":"models/gm",`+geminiUser+`}`), "gm", false)
	out, _ := rewriteGemini(r, "gemini-up", 5)
	if !strings.Contains(string(out), `"model":"models/gemini-up"`) {
		t.Fatalf("model not rewritten: %s", out)
	}
}

func TestGeminiUsage(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Usage
		found      bool
		err        string
	}{
		{"plain", `{"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":20,"totalTokenCount":120}}`, Usage{Input: 100, Output: 20}, true, ""},
		{"cached and thoughts", `{"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":20,"thoughtsTokenCount":30,"cachedContentTokenCount":60,"totalTokenCount":150}}`,
			Usage{Input: 100, Output: 50, CachedInput: 60}, true, ""},
		{"tool-use prompt is input", `{"usageMetadata":{"promptTokenCount":100,"toolUsePromptTokenCount":10,"candidatesTokenCount":5,"totalTokenCount":115}}`,
			Usage{Input: 110, Output: 5}, true, ""},
		{"unattributed total is output", `{"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":5,"totalTokenCount":140}}`, Usage{Input: 100, Output: 40}, true, ""},
		{"no candidates (blocked)", `{"usageMetadata":{"promptTokenCount":7,"totalTokenCount":7}}`, Usage{Input: 7}, true, ""},
		{"none", `{"candidates":[]}`, Usage{}, false, ""},
		{"no prompt count", `{"usageMetadata":{"candidatesTokenCount":5}}`, Usage{}, false, "lacks promptTokenCount"},
		{"negative", `{"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":-5}}`, Usage{}, false, "negative"},
		{"more cached than prompt", `{"usageMetadata":{"promptTokenCount":5,"cachedContentTokenCount":6}}`, Usage{}, false, "exceed"},
		{"not JSON", `{`, Usage{}, false, "not a JSON object"},
	} {
		u, found, err := parseGeminiResponse([]byte(tc.body))
		if u != tc.want || found != tc.found || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %+v %v %v, want %+v %v %q", tc.name, u, found, err, tc.want, tc.found, tc.err)
		}
	}
}

// geminiSSE is a Gemini stream as Google sends it (CRLF, usage on
// every chunk, the final counts on the last).
const geminiSSE = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Think\",\"thought\":true}],\"role\":\"model\"},\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":90,\"totalTokenCount\":90},\"modelVersion\":\"gemini-up\",\"responseId\":\"r1\"}\r\n\r\n" +
	"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Let me\"}],\"role\":\"model\"},\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":90,\"totalTokenCount\":90}}\r\n\r\n" +
	"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\" look.\",\"thoughtSignature\":\"c2ln\"}],\"role\":\"model\"},\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":90,\"totalTokenCount\":90}}\r\n\r\n" +
	"data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"run_shell_command\",\"args\":{\"command\":\"ls\"}}}],\"role\":\"model\"},\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":90,\"totalTokenCount\":90}}\r\n\r\n" +
	"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"\"}],\"role\":\"model\"},\"finishReason\":\"STOP\",\"index\":0,\"safetyRatings\":[]}],\"usageMetadata\":{\"promptTokenCount\":90,\"candidatesTokenCount\":12,\"thoughtsTokenCount\":8,\"cachedContentTokenCount\":40,\"totalTokenCount\":110},\"modelVersion\":\"gemini-up\",\"responseId\":\"r1\"}\r\n\r\n"

func TestGeminiAssembler(t *testing.T) {
	a := &geminiAssembler{}
	feed(t, a, []byte(geminiSSE))
	u, found, err := a.Usage()
	if !found || err != nil || u != (Usage{Input: 90, Output: 20, CachedInput: 40}) || !a.Complete() {
		t.Fatalf("usage %+v %v %v, complete %v", u, found, err, a.Complete())
	}
	var resp struct {
		Candidates []struct {
			Content struct {
				Role  string           `json:"role"`
				Parts []map[string]any `json:"parts"`
			} `json:"content"`
			FinishReason string `json:"finishReason"`
			Index        int    `json:"index"`
			Safety       []any  `json:"safetyRatings"`
		} `json:"candidates"`
		ModelVersion string `json:"modelVersion"`
		ResponseID   string `json:"responseId"`
	}
	if err := json.Unmarshal(a.Response(), &resp); err != nil {
		t.Fatal(err)
	}
	c := resp.Candidates[0]
	parts, _ := json.Marshal(c.Content.Parts)
	want := `[{"text":"Think","thought":true},{"text":"Let me look.","thoughtSignature":"c2ln"},{"functionCall":{"args":{"command":"ls"},"name":"run_shell_command"}}]`
	if string(parts) != want || c.Content.Role != "model" || c.FinishReason != "STOP" || c.Safety == nil ||
		resp.ModelVersion != "gemini-up" || resp.ResponseID != "r1" {
		t.Fatalf("answer %s\nparts %s\nwant  %s", a.Response(), parts, want)
	}
	if got := geminiTexts(a.Response()); len(got) != 1 || got[0] != "Let me look." {
		t.Fatalf("texts %q", got)
	}
	// Cut before the last chunk: the running counts are not the usage.
	cut := &geminiAssembler{}
	feed(t, cut, []byte(geminiSSE[:strings.Index(geminiSSE, `data: {"candidates":[{"content":{"parts":[{"text":""}]`)]))
	if u, found, err := cut.Usage(); found || err == nil || cut.Complete() {
		t.Fatalf("cut stream: usage %+v found %v err %v complete %v", u, found, err, cut.Complete())
	}
	// A blocked prompt ends the stream without candidates.
	blocked := &geminiAssembler{}
	feed(t, blocked, []byte("data: {\"promptFeedback\":{\"blockReason\":\"SAFETY\"},\"usageMetadata\":{\"promptTokenCount\":9,\"totalTokenCount\":9}}\n\n"))
	if u, found, err := blocked.Usage(); !found || err != nil || u.Input != 9 || !blocked.Complete() {
		t.Fatalf("blocked: usage %+v found %v err %v complete %v", u, found, err, blocked.Complete())
	}
}

func FuzzGeminiStream(f *testing.F) {
	f.Add([]byte(geminiSSE))
	f.Add([]byte("data: {\"candidates\":[{\"index\":99999999}]}\n\n"))
	f.Add([]byte("data: {\"candidates\":[{\"index\":1,\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":1}}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) { feed(t, &geminiAssembler{}, b) })
}

func FuzzGeminiRequest(f *testing.F) {
	f.Add([]byte(`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png"}}]}],"generationConfig":{"maxOutputTokens":50,"candidateCount":2,"thinkingConfig":{"thinkingBudget":60}}}`))
	f.Add([]byte(`{"model":"x","contents":[{"parts":[{"functionResponse":{"parts":[{"inlineData":{"mimeType":"IMAGE/JPEG"}}]}}]}],"tools":[{"functionDeclarations":[]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseGeminiRequest(b, "gm", false)
		if err != nil {
			return
		}
		if r.Model != "gm" || r.Choices < 1 || r.Choices > maxChoices || r.Requested < 0 || r.Images < 0 {
			t.Fatalf("accepted %q as %+v", b, r)
		}
		out, err := rewriteGemini(r, "up", 7)
		if err != nil {
			return
		}
		again, err := parseGeminiRequest(out, "gm", false)
		if err != nil || again.Requested != 7 || again.Images != r.Images || again.Choices != r.Choices {
			t.Fatalf("rewrite of %q gives %q: %+v, %v", b, out, again, err)
		}
		var gc struct {
			GenerationConfig struct {
				ThinkingConfig struct {
					ThinkingBudget *int64 `json:"thinkingBudget"`
				} `json:"thinkingConfig"`
			} `json:"generationConfig"`
		}
		if json.Unmarshal(out, &gc) == nil && gc.GenerationConfig.ThinkingConfig.ThinkingBudget != nil && *gc.GenerationConfig.ThinkingConfig.ThinkingBudget >= 7 {
			t.Fatalf("rewrite of %q keeps a thinking budget at or over the bound: %s", b, out)
		}
	})
}

func FuzzGeminiResponseUsage(f *testing.F) {
	f.Add([]byte(`{"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":20,"thoughtsTokenCount":30,"cachedContentTokenCount":60,"totalTokenCount":150}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, found, err := parseGeminiResponse(b)
		if found && (err != nil || u.Validate() != nil) {
			t.Fatalf("%q: usage %+v found with error %v", b, u, err)
		}
	})
}

func TestToHALGemini(t *testing.T) {
	answer := []byte(`{"candidates":[{"content":{"role":"model","parts":[{"text":"thinking","thought":true},{"text":"The answer"},{"functionCall":{"name":"f"}},{"text":" is 42."}]}}]}`)
	calls := []TrajectoryCall{{Call: Call{ID: "bafy1", Attempt: "at-1", API: CallGeminiGenerate, Model: "gemini", Status: 200,
		UsageReported: true, Usage: Usage{Input: 100, Output: 30, CachedInput: 60}, Cost: 5}, RequestBody: []byte(`{}`), ResponseBody: answer}}
	h, err := ToHAL("capsule-1", calls)
	if err != nil || len(h.Calls) != 1 {
		t.Fatalf("%+v %v", h, err)
	}
	c := h.Calls[0]
	u := c.Summary.Usage["gemini"]
	if c.OpName != "google.genai.models.generate_content" || len(c.Outputs.Choices) != 1 || c.Outputs.Choices[0] != "The answer is 42." ||
		u["prompt_token_count"] != int64(100) || u["candidates_token_count"] != int64(30) || u["cached_content_token_count"] != int64(60) {
		t.Fatalf("gemini entry %+v usage %v", c, u)
	}
	if h.Usage["gemini"] != (HALTokenUsage{PromptTokens: 100, CompletionTokens: 30, CacheReadInputTokens: 60}) {
		t.Fatalf("total usage %+v", h.Usage)
	}
}
