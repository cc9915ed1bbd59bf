package verify_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/repronet/repronet/verify"
)

// chat is one conversation of an agent: a prompt, the commands the model
// asks for in turn with their outputs, and the model's last answer.
type chat struct {
	system, user string
	commands     []string
	outputs      []string
	final        string
	ids          string // prefix of its tool call ids
}

func (c chat) exchanges() []verify.Exchange {
	msgs := []msg{{Role: "system", Content: c.system}, {Role: "user", Content: c.user}}
	var out []verify.Exchange
	for i := 0; i <= len(c.commands); i++ {
		reply := msg{Role: "assistant", Content: c.final}
		if i < len(c.commands) {
			reply = msg{Role: "assistant", ToolCalls: []call{toolCall(fmt.Sprintf("%s_%d", c.ids, i), "bash",
				fmt.Sprintf(`{"command": %q}`, c.commands[i]))}}
		}
		out = append(out, verify.Exchange{API: verify.APIOpenAIChat, Model: "m", Request: request(msgs), Response: answer(reply)})
		msgs = append(msgs, reply)
		if i < len(c.commands) {
			msgs = append(msgs, msg{Role: "tool", ToolCallID: fmt.Sprintf("%s_%d", c.ids, i), Content: c.outputs[i]})
		}
	}
	return out
}

func (c chat) with(i int, output string) chat {
	c.outputs = slices.Clone(c.outputs)
	c.outputs[i] = output
	return c
}

// label names an exchange by its conversation (a letter) and position.
type label struct {
	conv byte
	pos  int
}

// interleave takes the conversations' exchanges in the order order names
// them (one letter a call: 'A' the first conversation, ...).
func interleave(convs [][]verify.Exchange, order string) ([]verify.Exchange, []label) {
	next := make([]int, len(convs))
	var out []verify.Exchange
	var labels []label
	for _, l := range []byte(order) {
		k := int(l - 'A')
		out = append(out, convs[k][next[k]])
		labels = append(labels, label{l, next[k]})
		next[k]++
	}
	return out, labels
}

// The agent of these tests: a main loop (A), a sub-agent (B) and a small
// model's title request (C), made concurrently.
var (
	mainLoop = chat{system: "You are an agent.", user: "Reproduce the paper.", ids: "main",
		commands: []string{"ls results", "cat results/metrics.txt"},
		outputs:  []string{"metrics.txt\n", "accuracy: 0.93456\n"}, final: "The accuracy is 0.9346."}
	subAgent = chat{system: "You are a sub-agent.", user: "Find the method.", ids: "sub",
		commands: []string{"cat README.md"}, outputs: []string{"method: ridge regression\n"}, final: "Ridge regression."}
	title = chat{system: "Write a title.", user: "Reproduce the paper.", final: "Reproducing a paper"}
)

func agentConvs(a, b, c chat) [][]verify.Exchange {
	return [][]verify.Exchange{a.exchanges(), b.exchanges(), c.exchanges()}
}

func TestSplit(t *testing.T) {
	convs := agentConvs(mainLoop, subAgent, title)
	a := convs[0]
	forked := mainLoop.with(0, "metrics.txt gold.txt\n").exchanges()
	var dropped []msg
	json.Unmarshal(a[2].Request, &struct{ Messages *[]msg }{&dropped})
	dropped = append(dropped[:2:2], dropped[4:]...)
	twoTitles := [][]verify.Exchange{title.exchanges(), {{API: verify.APIOpenAIChat, Model: "m", Request: title.exchanges()[0].Request,
		Response: answer(msg{Role: "assistant", Content: "Another title"})}}}
	for _, tc := range []struct {
		name  string
		ex    []verify.Exchange
		want  [][]int // the answered exchanges of each conversation
		finds []int   // steps with a rewrite finding
	}{
		{"one conversation", a, [][]int{{0, 1, 2}}, nil},
		{"interleaved", must(interleave(convs, "ABCABA")), [][]int{{0, 3, 5}, {1, 4}, {2}}, nil},
		{"interleaved otherwise", must(interleave(convs, "CBBAAA")), [][]int{{0}, {1, 2}, {3, 4, 5}}, nil},
		{"identical side calls", must(interleave([][]verify.Exchange{a, twoTitles[0], twoTitles[1]}, "ABACA")), [][]int{{0, 2, 4}, {1}, {3}}, nil},
		{"a retry", append(slices.Clone(a), a[1]), [][]int{{0, 1, 2}, {3}}, nil},
		{"a fork: same prefix, two continuations", append(slices.Clone(a[:2]), forked[1]), [][]int{{0, 1}, {2}}, []int{2}},
		{"a rewritten history", append(slices.Clone(a[:2]), verify.Exchange{API: verify.APIOpenAIChat, Request: request(dropped), Response: a[2].Response}),
			[][]int{{0, 1}, {2}}, []int{2}},
		{"a failed call and its retry", []verify.Exchange{a[0], {API: a[1].API, Request: a[1].Request, Failed: true}, a[1], a[2]}, [][]int{{0, 2, 3}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := verify.SplitExchanges(tc.ex)
			if !slices.EqualFunc(sp.Convs, tc.want, slices.Equal) {
				t.Fatalf("conversations %v, want %v", sp.Convs, tc.want)
			}
			var got []int
			for _, f := range sp.Findings {
				got = append(got, f.Step)
			}
			if !slices.Equal(got, tc.finds) {
				t.Fatalf("findings %+v, want at %v", sp.Findings, tc.finds)
			}
			for c, conv := range sp.Convs {
				for p, i := range conv {
					if pl := sp.Places[i]; pl.Conv != c || pl.Pos != p {
						t.Fatalf("exchange %d placed %+v, want conversation %d position %d", i, pl, c, p)
					}
				}
			}
			if f := verify.CheckAppendOnly(tc.ex); len(f) != len(tc.finds) {
				t.Fatalf("CheckAppendOnly: %+v", f)
			}
		})
	}
}

func must[A, B any](a A, _ B) A { return a }

// strip is a replay's call as the gateway gets it: no answer yet.
func strip(e verify.Exchange) verify.Exchange {
	return verify.Exchange{API: e.API, Model: e.Model, Request: e.Request}
}

func TestMatcher(t *testing.T) {
	rec := agentConvs(mainLoop, subAgent, title)
	// The sub-agent's tool printed something else in the replay: its
	// calls are still paired (tool results never decide a pairing).
	noisy := agentConvs(mainLoop, subAgent.with(0, "method: lasso\n"), title)
	for _, tc := range []struct {
		name              string
		recorded, replay  [][]verify.Exchange
		recOrder, repOder string
	}{
		{"same order", rec, rec, "ABCABA", "ABCABA"},
		{"another interleaving", rec, rec, "ABCABA", "CAAABB"},
		{"sub-agent first", rec, rec, "AAABBC", "BBCAAA"},
		{"a different tool result", rec, noisy, "ABCABA", "BACBAA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recorded, rl := interleave(tc.recorded, tc.recOrder)
			replay, pl := interleave(tc.replay, tc.repOder)
			m := verify.NewMatcher(recorded, verify.DefaultTolerance())
			for j, e := range replay {
				x, err := m.Match(strip(e))
				if err != nil {
					t.Fatalf("replay call %d %v: %v", j, pl[j], err)
				}
				if rl[x.Recorded] != pl[j] {
					t.Fatalf("replay call %d %v given recorded call %d %v", j, pl[j], x.Recorded, rl[x.Recorded])
				}
				if want := bytes.Equal(e.Request, recorded[x.Recorded].Request); x.Exact != want {
					t.Fatalf("replay call %d: exact %v, want %v", j, x.Exact, want)
				}
				m.Commit(x)
			}
			_, err := m.Match(strip(replay[0]))
			var nm *verify.NoMatchError
			if !errors.As(err, &nm) || !nm.Exhausted || nm.Recorded != len(recorded) {
				t.Fatalf("a call past the recording: %v", err)
			}
			// Pair, offline, pairs the same.
			for j, i := range verify.Pair(recorded, replay, verify.DefaultTolerance()) {
				if i < 0 || rl[i] != pl[j] {
					t.Fatalf("Pair: replay call %d %v paired with %d", j, pl[j], i)
				}
			}
		})
	}
}

func TestMatcherChoices(t *testing.T) {
	a := mainLoop.exchanges()
	t1 := title.exchanges()[0]
	t2 := verify.Exchange{API: t1.API, Model: t1.Model, Request: t1.Request, Response: answer(msg{Role: "assistant", Content: "Another title"})}
	other := chat{system: "Write a title.", user: "Summarise the logs.", final: "Logs"}.exchanges()[0]
	tol := verify.DefaultTolerance()
	t.Run("identical side calls: first unused", func(t *testing.T) {
		m := verify.NewMatcher([]verify.Exchange{t1, a[0], t2}, tol)
		var got []int
		for range 2 {
			x, err := m.Match(strip(t1))
			if err != nil {
				t.Fatal(err)
			}
			m.Commit(x)
			got = append(got, x.Recorded)
		}
		if !slices.Equal(got, []int{0, 2}) {
			t.Fatalf("two identical title requests given %v, want [0 2]", got)
		}
	})
	t.Run("the same content wins over the first", func(t *testing.T) {
		m := verify.NewMatcher([]verify.Exchange{other, t1}, tol)
		x, err := m.Match(strip(t1))
		if err != nil || x.Recorded != 1 || !x.Exact {
			t.Fatalf("got %+v %v, want recorded 1 exactly", x, err)
		}
		// A start that shares the system prompt only is paired with
		// what is left, not exactly.
		x, err = m.Match(strip(chat{system: "Write a title.", user: "Something else.", final: "x"}.exchanges()[0]))
		if err != nil || x.Recorded != 0 || x.Exact {
			t.Fatalf("got %+v %v, want recorded 0, not exactly", x, err)
		}
	})
	t.Run("a start sharing nothing is refused", func(t *testing.T) {
		m := verify.NewMatcher([]verify.Exchange{t1}, tol)
		_, err := m.Match(strip(subAgent.exchanges()[0]))
		var nm *verify.NoMatchError
		if !errors.As(err, &nm) || nm.Exhausted {
			t.Fatalf("got %v, want no match", err)
		}
	})
	t.Run("another model is refused", func(t *testing.T) {
		m := verify.NewMatcher([]verify.Exchange{t1}, tol)
		e := strip(t1)
		e.Model = "small"
		if _, err := m.Match(e); err == nil {
			t.Fatal("a call for another model was paired")
		}
	})
	t.Run("a released match is given again", func(t *testing.T) {
		m := verify.NewMatcher([]verify.Exchange{t1}, tol)
		x, _ := m.Match(strip(t1))
		if _, err := m.Match(strip(t1)); err == nil {
			t.Fatal("a reserved call was given twice")
		}
		m.Release(x)
		if y, err := m.Match(strip(t1)); err != nil || y.Recorded != 0 {
			t.Fatalf("after release: %+v %v", y, err)
		}
	})
	t.Run("a continuation past its recorded conversation is refused", func(t *testing.T) {
		m := verify.NewMatcher([]verify.Exchange{a[0], a[1], t1}, tol)
		for _, e := range a[:2] {
			x, err := m.Match(strip(e))
			if err != nil {
				t.Fatal(err)
			}
			m.Commit(x)
		}
		_, err := m.Match(strip(a[2]))
		var nm *verify.NoMatchError
		if !errors.As(err, &nm) || nm.Exhausted {
			t.Fatalf("got %v, want no match while a title call is left", err)
		}
	})
	t.Run("resumed after a restart", func(t *testing.T) {
		rec, _ := interleave(agentConvs(mainLoop, subAgent, title), "ABCABA")
		m := verify.NewMatcher(rec, tol)
		// The replay made the main loop's first two calls (recorded 0
		// and 3) before the restart.
		if err := m.Resume(strip(rec[0]), 0); err != nil {
			t.Fatal(err)
		}
		if err := m.Resume(strip(rec[3]), 3); err != nil {
			t.Fatal(err)
		}
		x, err := m.Match(strip(rec[5]))
		if err != nil || x.Recorded != 5 {
			t.Fatalf("the main loop's third call: %+v %v", x, err)
		}
		if err := m.Resume(strip(rec[1]), 0); err == nil {
			t.Fatal("resumed onto an exchange already given")
		}
	})
}

func TestCompareConversations(t *testing.T) {
	ans := answers("acc", "0.9346", "method", `"ridge regression"`)
	honestRec := must(interleave(agentConvs(mainLoop, subAgent, title), "ABCABA"))
	// The node planted the gold answer in the sub-agent's tool result.
	planted := subAgent.with(0, "method: ridge regression\naccuracy: 0.97210\n")
	plantedMain := mainLoop
	plantedMain.final = "The accuracy is 0.9721."
	plantedRec := must(interleave(agentConvs(plantedMain, planted, title), "ABCABA"))
	plantedAns := answers("acc", "0.9721", "method", `"ridge regression"`)
	honestReplay := func(order string) []verify.Exchange {
		return must(interleave(agentConvs(plantedMain, subAgent, title), order))
	}
	noTitle := must(interleave(agentConvs(mainLoop, subAgent, title)[:2], "AABBA"))
	for _, tc := range []struct {
		name      string
		recorded  []verify.Exchange
		answers   []verify.Answer
		replays   [][]verify.Exchange
		want      verify.Verdict
		unreached int
	}{
		{"honest, replayed in another interleaving", honestRec, ans, [][]verify.Exchange{must(interleave(agentConvs(mainLoop, subAgent, title), "CBBAAA"))}, verify.Verified, 0},
		{"honest, the title call never made", honestRec, ans, [][]verify.Exchange{noTitle}, verify.Verified, 1},
		{"gold planted in a sub-agent's result, one replay", plantedRec, plantedAns, [][]verify.Exchange{honestReplay("BBAAAC")}, verify.NeedsReplay, 0},
		{"gold planted in a sub-agent's result, two replays", plantedRec, plantedAns, [][]verify.Exchange{honestReplay("BBAAAC"), honestReplay("AABBCA")}, verify.Forged, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := verify.Judge(tc.recorded, tc.replays, tc.answers, verify.DefaultTolerance())
			if j.Verdict != tc.want || j.Benign != 0 {
				t.Fatalf("verdict %s, %d benign (%s), want %s", j.Verdict, j.Benign, j.Reason, tc.want)
			}
			c := j.Comparisons[0]
			if len(c.Unreached) != tc.unreached || c.Count(verify.Missing) != 0 {
				t.Fatalf("unreached %v, %d missing; want %d unreached, none missing", c.Unreached, c.Count(verify.Missing), tc.unreached)
			}
			if len(c.Steps) != 3 {
				t.Fatalf("%d tool results compared, want 3", len(c.Steps))
			}
		})
	}
}

// FuzzSplit: splitting and pairing read bodies an agent sent; whatever
// they hold, every exchange is placed, each answered one in one
// conversation, and a replay of the recording is paired whole.
func FuzzSplit(f *testing.F) {
	for _, ex := range [][]verify.Exchange{mainLoop.exchanges(), must(interleave(agentConvs(mainLoop, subAgent, title), "ABCABA"))} {
		var b bytes.Buffer
		for _, e := range ex {
			b.Write(e.Request)
			b.WriteByte(0)
			b.Write(e.Response)
			b.WriteByte(0)
		}
		f.Add(b.Bytes(), uint8(0))
	}
	for k, api := range []string{verify.APIOpenAIResponses, verify.APIGeminiGenerate} {
		var b bytes.Buffer
		for _, e := range apiConv(api, "Find the answer.", "42") {
			b.Write(e.Request)
			b.WriteByte(0)
			b.Write(e.Response)
			b.WriteByte(0)
		}
		f.Add(b.Bytes(), uint8(k+2))
	}
	f.Add([]byte(`{"model":"m","system":"s","messages":[{"role":"user","content":"go"}]}`+"\x00"+`{"role":"assistant","content":[{"type":"text","text":"x"}]}`+"\x00"), uint8(1))
	f.Add([]byte("{\x00[]\x00null\x00{}\x00"), uint8(0))
	apis := []string{verify.APIOpenAIChat, verify.APIAnthropicMessages, verify.APIOpenAIResponses, verify.APIGeminiGenerate, "other"}
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		api := apis[int(which)%len(apis)]
		parts := bytes.Split(data, []byte{0})
		var ex []verify.Exchange
		for i := 0; i+1 < len(parts) && len(ex) < 32; i += 2 {
			ex = append(ex, verify.Exchange{API: api, Request: parts[i], Response: parts[i+1], Failed: len(parts[i+1]) == 0})
		}
		sp := verify.SplitExchanges(ex)
		if len(sp.Places) != len(ex) {
			t.Fatalf("%d places for %d exchanges", len(sp.Places), len(ex))
		}
		seen := map[int]bool{}
		for _, conv := range sp.Convs {
			for _, i := range conv {
				if seen[i] {
					t.Fatalf("exchange %d in two conversations", i)
				}
				seen[i] = true
			}
		}
		m := verify.NewMatcher(ex, verify.DefaultTolerance())
		for _, e := range ex {
			if x, err := m.Match(strip(e)); err == nil {
				m.Commit(x)
			}
		}
		_ = verify.Pair(ex, ex, verify.DefaultTolerance())
	})
}

// TestCompareRetry: a recorded call that failed (the provider erred) and
// was retried is stood for by its retry: its tool results are compared
// once, and a replay that never made the failed call misses nothing.
func TestCompareRetry(t *testing.T) {
	a := mainLoop.exchanges()
	failed := verify.Exchange{API: a[1].API, Model: a[1].Model, Request: a[1].Request, Failed: true}
	recorded := []verify.Exchange{a[0], failed, a[1], a[2]}
	if sp := verify.SplitExchanges(recorded); !sp.Places[1].Retried || sp.Places[2].Retried {
		t.Fatalf("places %+v: want the failed call retried", sp.Places)
	}
	j := verify.Judge(recorded, [][]verify.Exchange{a}, answers("acc", "0.9346"), verify.DefaultTolerance())
	c := j.Comparisons[0]
	if j.Verdict != verify.Verified || len(c.Steps) != 2 || c.Count(verify.Same) != 2 || len(c.Unreached) != 0 {
		t.Fatalf("verdict %s (%s), comparison %+v", j.Verdict, j.Reason, c)
	}
}

// BenchmarkReplayPairing: what the gateway spends pairing a long replay
// (a main loop of 120 calls whose tool results add 2 KB each, beside a
// sub-agent of 30 and 20 title calls): reading the recording once, then
// pairing every call as it comes.
func BenchmarkReplayPairing(b *testing.B) {
	long := func(name, ids string, n int) chat {
		c := chat{system: "You are " + name + ".", user: "Reproduce the paper.", ids: ids, final: "Done."}
		for i := range n {
			c.commands = append(c.commands, fmt.Sprintf("step %d", i))
			c.outputs = append(c.outputs, fmt.Sprintf("output %d: %s\n", i, strings.Repeat("x", 2048)))
		}
		return c
	}
	convs := [][]verify.Exchange{long("an agent", "m", 120).exchanges(), long("a sub-agent", "s", 30).exchanges()}
	order := strings.Repeat("A", 121) + strings.Repeat("B", 31)
	for i := range 20 {
		convs = append(convs, chat{system: "Write a title.", user: fmt.Sprintf("Turn %d.", i), final: "T"}.exchanges())
		order += string(rune('C' + i))
	}
	recorded, _ := interleave(convs, order)
	replay := make([]verify.Exchange, len(recorded))
	for i, e := range recorded {
		replay[len(recorded)-1-i] = strip(e) // titles first, the sub-agent, then the main loop
	}
	slices.SortStableFunc(replay, func(x, y verify.Exchange) int { return len(x.Request) - len(y.Request) })
	size := 0
	for _, e := range recorded {
		size += len(e.Request)
	}
	for b.Loop() {
		m := verify.NewMatcher(recorded, verify.DefaultTolerance())
		for _, e := range replay {
			x, err := m.Match(e)
			if err != nil {
				b.Fatal(err)
			}
			m.Commit(x)
		}
	}
	b.ReportMetric(float64(size)/1e6, "MB-recorded")
	b.ReportMetric(float64(len(recorded)), "calls")
}

// TestMatcherRetried: a recorded call made twice (its first answer lost
// to a timeout) is replayed with the answer the agent went on from.
func TestMatcherRetried(t *testing.T) {
	a := mainLoop.exchanges()
	lost := a[1]
	lost.Response = answer(msg{Role: "assistant", Content: "A lost answer."})
	recorded := []verify.Exchange{a[0], lost, a[1], a[2]}
	if f := verify.CheckAppendOnly(recorded); len(f) != 0 {
		t.Fatalf("a retry is a finding: %+v", f)
	}
	m := verify.NewMatcher(recorded, verify.DefaultTolerance())
	var got []int
	for _, e := range a {
		x, err := m.Match(strip(e))
		if err != nil {
			t.Fatal(err)
		}
		m.Commit(x)
		got = append(got, x.Recorded)
	}
	if !slices.Equal(got, []int{0, 2, 3}) {
		t.Fatalf("given %v, want [0 2 3]", got)
	}
}
