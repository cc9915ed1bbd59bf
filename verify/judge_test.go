package verify_test

import (
	"slices"
	"testing"

	"github.com/repronet/repronet/verify"
)

// TestJudgeForgeries: the forgeries of issue 25 that passed the old judge
// and the honest cases that must not be punished (issue 25 items 2-5, 9).
func TestJudgeForgeries(t *testing.T) {
	tol := verify.DefaultTolerance()
	// A conversion: the model derives 20.1 (km) from the tool's 12.5 miles;
	// the node forged the input, the answer is not in it literally.
	derive := run{commands: []string{"cat distance.txt"}, outputs: []string{"distance: 7.5 miles\n"},
		submit: `{"answers": {"km": 20.1}}`}
	derived := derive.with(0, "distance: 12.5 miles\n")
	// A number with a unit the old normaliser erased.
	timed := run{commands: []string{"./bench"}, outputs: []string{"train took 12.5 s\n"}, submit: `{"answers": {"t": "12.5 s"}}`}
	// A string with digits: one lying replayer must not decide.
	version := run{commands: []string{"cat VERSION"}, outputs: []string{"release v2.3.1-rc4\n"}, submit: `{"answers": {"v": "v2.3.1-rc4"}}`}
	lie := version.with(0, "release v9.9.9\n")
	// A replay that makes a call the recording lacks.
	extra := func(r run) []verify.Exchange {
		return append(r.exchanges(), verify.Exchange{API: verify.APIOpenAIChat, Failed: true,
			Request: request([]msg{{Role: "user", Content: "a call the recording lacks"}})})
	}
	ex := func(rs ...run) [][]verify.Exchange {
		var out [][]verify.Exchange
		for _, r := range rs {
			out = append(out, r.exchanges())
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		recorded []verify.Exchange
		answers  []verify.Answer
		replays  [][]verify.Exchange
		repAns   [][]verify.Answer
		want     verify.Verdict
		outvoted []int
	}{
		{"derived from a forged input, two replays", derived.exchanges(), answers("km", "20.1"), ex(derive, derive), nil, verify.NeedsReplay, nil},
		{"derived from a forged input, three replays", derived.exchanges(), answers("km", "20.1"), ex(derive, derive, derive), nil, verify.Forged, nil},
		{"derived, honest noise: the replays disagree", derive.with(0, "distance: 7.5 miles seed 31\n").exchanges(), answers("km", "20.1"),
			ex(derive.with(0, "distance: 7.5 miles seed 77\n"), derive.with(0, "distance: 7.5 miles seed 12\n")), nil, verify.Verified, nil},
		{"a duration is an answer: kept by the normaliser", timed.exchanges(), answers("t", `"12.5 s"`),
			ex(timed.with(0, "train took 3.1 s\n"), timed.with(0, "train took 3.1 s\n")), nil, verify.Forged, nil},
		{"a duration is an answer, honest timing", timed.exchanges(), answers("t", `"12.5 s"`),
			ex(timed.with(0, "train took 3.1 s\n"), timed.with(0, "train took 4.4 s\n")), nil, verify.Nondeterministic, nil},
		{"one lying replayer, string with digits", version.exchanges(), answers("v", `"v2.3.1-rc4"`), ex(lie, version), nil, verify.NeedsReplay, nil},
		{"one lying replayer outvoted", version.exchanges(), answers("v", `"v2.3.1-rc4"`), ex(lie, version, version), nil, verify.Verified, []int{0}},
		{"two agreeing liars against an honest recording", version.exchanges(), answers("v", `"v2.3.1-rc4"`), ex(lie, lie), nil, verify.Forged, nil},
		{"a replay call the recording lacks, one replay", version.exchanges(), answers("v", `"v2.3.1-rc4"`),
			[][]verify.Exchange{extra(version)}, nil, verify.NeedsReplay, nil},
		{"a replay call the recording lacks, two replays", version.exchanges(), answers("v", `"v2.3.1-rc4"`),
			[][]verify.Exchange{extra(version), extra(version)}, nil, verify.Forged, nil},
		{"no model call, answers reproduced", nil, answers("x", "42"), [][]verify.Exchange{nil}, [][]verify.Answer{answers("x", "42")}, verify.Verified, nil},
		{"no model call, one replica differs", nil, answers("x", "42"), [][]verify.Exchange{nil}, [][]verify.Answer{answers("x", "7")}, verify.NeedsReplay, nil},
		{"no model call, two replicas agree against it", nil, answers("x", "42"), [][]verify.Exchange{nil, nil},
			[][]verify.Answer{answers("x", "7"), answers("x", "7")}, verify.Forged, nil},
		{"no model call, replicas disagree", nil, answers("x", "42"), [][]verify.Exchange{nil, nil},
			[][]verify.Answer{answers("x", "7"), answers("x", "9")}, verify.Nondeterministic, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := verify.JudgeAll(verify.JudgeInput{Recorded: tc.recorded, Answers: tc.answers, Replays: tc.replays,
				ReplayAnswers: tc.repAns, Tolerance: tol})
			if j.Verdict != tc.want || !slices.Equal(j.Outvoted, tc.outvoted) {
				t.Fatalf("verdict %s, outvoted %v (%s); want %s, outvoted %v", j.Verdict, j.Outvoted, j.Reason, tc.want, tc.outvoted)
			}
		})
	}
}

// TestNormaliserKeepsAnswers: what the normaliser erases between honest
// runs it keeps when an answer could come from it.
func TestNormaliserKeepsAnswers(t *testing.T) {
	tol := verify.DefaultTolerance()
	if !tol.Same("took 12.5s", "took 9 ms") {
		t.Fatal("durations are benign when no answer holds them")
	}
	rec := run{commands: []string{"./bench"}, outputs: []string{"took 12.5s at 2026-11-24T09:13:44Z\n"}, submit: `{}`}
	rep := rec.with(0, "took 9 ms at 2026-11-24T10:00:00Z\n")
	for _, tc := range []struct {
		answer string
		steps  verify.Class
	}{
		{`"12.5s"`, verify.AnswerBearing},
		{`"2026-11-24T09:13:44Z"`, verify.AnswerBearing},
		{`"unrelated"`, verify.Same},
	} {
		c := verify.Compare(rec.exchanges(), rep.exchanges(), answers("a", tc.answer), tol)
		if len(c.Steps) != 1 || c.Steps[0].Class != tc.steps {
			t.Errorf("answer %s: steps %+v, want one %s", tc.answer, c.Steps, tc.steps)
		}
	}
}

// FuzzJudge: whatever bodies a recording and a replay hold (a node sends
// them), judging never panics and gives a known verdict.
func FuzzJudge(f *testing.F) {
	ex := honest.exchanges()
	for i := range ex {
		f.Add(ex[i].Request, ex[i].Response, `{"acc": 0.9346}`)
	}
	f.Add([]byte(`{"messages":[{"role":"tool","content":"12.5 s 2026-11-24"}]}`), []byte(`{}`), `"12.5 s"`)
	f.Fuzz(func(t *testing.T, req, resp []byte, answer string) {
		rec := honest.exchanges()
		rec[1] = verify.Exchange{API: verify.APIOpenAIChat, Request: req, Response: resp}
		rep := honest.exchanges()
		for _, reps := range [][][]verify.Exchange{{rep}, {rep, rec}, {rec, rep, rep}} {
			j := verify.JudgeAll(verify.JudgeInput{Recorded: rec, Answers: answers("a", answer), Replays: reps,
				ReplayAnswers: make([][]verify.Answer, len(reps)), Tolerance: verify.DefaultTolerance()})
			switch j.Verdict {
			case verify.Verified, verify.NeedsReplay, verify.Forged, verify.Nondeterministic:
			default:
				t.Fatalf("verdict %q", j.Verdict)
			}
		}
	})
}

// TestJudgeReplicaOutputs: a run without model calls (PaperBench's
// reproduction stage, an agent that answers without its model) is
// replayed as a replica, and outputs binding cannot read (tarballs,
// directories) are compared by content (issue 25.1, 25.7).
func TestJudgeReplicaOutputs(t *testing.T) {
	rec := map[string]string{"submission.tar": "bafyA"}
	for _, tc := range []struct {
		name    string
		replays []map[string]string
		want    verify.Verdict
	}{
		{"reproduced", []map[string]string{{"submission.tar": "bafyA"}}, verify.Verified},
		{"one replica differs", []map[string]string{{"submission.tar": "bafyB"}}, verify.NeedsReplay},
		{"two replicas agree against it", []map[string]string{{"submission.tar": "bafyB"}, {"submission.tar": "bafyB"}}, verify.Forged},
		{"replicas differ from each other", []map[string]string{{"submission.tar": "bafyB"}, {"submission.tar": "bafyC"}}, verify.Nondeterministic},
		{"a replica returned nothing, two others agree with it", []map[string]string{{}, {"submission.tar": "bafyA"}, {"submission.tar": "bafyA"}}, verify.Verified},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := verify.JudgeInput{Outputs: rec, ReplayOutputs: tc.replays, Replays: make([][]verify.Exchange, len(tc.replays)),
				Tolerance: verify.DefaultTolerance()}
			if j := verify.JudgeAll(in); j.Verdict != tc.want {
				t.Fatalf("verdict %s (%s), want %s", j.Verdict, j.Reason, tc.want)
			}
		})
	}
}
