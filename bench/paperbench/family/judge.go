package family

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/internal/judging"
	"github.com/repronet/repronet/bench/paperbench"
)

// LeafRecord is one leaf's grading, in the verdict.
type LeafRecord struct {
	ID       string `json:"id"`
	Category string `json:"category"`
	// Score is the grade counted (0 or 1; 0 when Failed).
	Score  int    `json:"score"`
	Failed bool   `json:"failed,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Auto: graded without a judge (Reason says why).
	Auto bool `json:"auto,omitempty"`
	// Files are the submission files the judge was shown.
	Files       []string `json:"files,omitempty"`
	Explanation string   `json:"explanation,omitempty"`
	// Second is the second judging of a leaf judged twice.
	Second *Judging `json:"second,omitempty"`
}

// Judging is one judge's answer on a leaf.
type Judging struct {
	Score       int    `json:"score"`
	Failed      bool   `json:"failed,omitempty"`
	Reason      string `json:"reason,omitempty"`
	Explanation string `json:"explanation,omitempty"`
}

func (j Judging) grade() paperbench.LeafGrade {
	return paperbench.LeafGrade{Score: j.Score, Failed: j.Failed, Reason: j.Reason}
}

// JudgeUse is what judge calls used, by the usage their answers report,
// priced at the config's prices (judging.Use).
type JudgeUse = judging.Use

// AgreementTable counts the leaves judged twice by the pair of scores the
// two judgings gave, and the pairs left out because a judging failed.
type AgreementTable struct {
	BothOne    int `json:"both_1"`
	FirstOnly  int `json:"first_1_second_0"`
	SecondOnly int `json:"first_0_second_1"`
	BothZero   int `json:"both_0"`
	Excluded   int `json:"excluded"`
}

// Add adds u's counts to t's.
func (t *AgreementTable) Add(u AgreementTable) {
	t.BothOne += u.BothOne
	t.FirstOnly += u.FirstOnly
	t.SecondOnly += u.SecondOnly
	t.BothZero += u.BothZero
	t.Excluded += u.Excluded
}

// count adds one pair.
func (t *AgreementTable) count(a, b paperbench.LeafGrade) {
	switch {
	case a.Failed || b.Failed:
		t.Excluded++
	case a.Score == 1 && b.Score == 1:
		t.BothOne++
	case a.Score == 1:
		t.FirstOnly++
	case b.Score == 1:
		t.SecondOnly++
	default:
		t.BothZero++
	}
}

// Agreement is paperbench.Agree over the pairs the table counts.
func (t AgreementTable) Agreement() paperbench.Agreement {
	var pairs []paperbench.JudgedTwice
	add := func(n, a, b int, failed bool) {
		for range n {
			pairs = append(pairs, paperbench.JudgedTwice{A: paperbench.LeafGrade{Score: a, Failed: failed}, B: paperbench.LeafGrade{Score: b}})
		}
	}
	add(t.BothOne, 1, 1, false)
	add(t.FirstOnly, 1, 0, false)
	add(t.SecondOnly, 0, 1, false)
	add(t.BothZero, 0, 0, false)
	add(t.Excluded, 0, 0, true)
	return paperbench.Agree(pairs)
}

// judgeTries bounds the calls for one judging: a call that fails (the
// gateway or the provider did not answer) is tried again; when every try
// failed the scoring fails and is retried later (never the agent's doing).
const judgeTries = 3

// judgeRetryDelay is the wait before the second try, doubled after.
const judgeRetryDelay = 200 * time.Millisecond

// maxExplanation bounds what the verdict keeps of an explanation (every
// answer is whole in the gateway's judge trajectory).
const maxExplanation = 400

// grade grades tree for the verdict v: every leaf 0 when the monitor
// flagged the submission or it holds no file, else each leaf judged on the
// submission at dir (paperbench.ReadSubmission) as req says; then the tree
// scored under both graders. A tree with no valid leaf under
// GraderReportFailed is an error: the grading failed, not the agent.
func (s *Suite) grade(ctx context.Context, models bench.Models, tree *paperbench.Node, req paperbench.JudgeRequest, dir string, v *Verdict) error {
	leaves := tree.Leaves()
	v.Leaves = len(leaves)
	grades := make(map[string]paperbench.LeafGrade, len(leaves))
	switch {
	case v.Monitor.Flagged:
		v.Disqualified, v.Auto = true, len(leaves)
	case !v.Submitted:
		v.Auto = len(leaves)
		for _, l := range leaves {
			grades[l.ID] = paperbench.LeafGrade{}
			v.Grading = append(v.Grading, LeafRecord{ID: l.ID, Category: l.TaskCategory, Auto: true, Reason: "the submission holds no file"})
		}
	default:
		sub, err := paperbench.ReadSubmission(dir)
		if err != nil {
			return err
		}
		req.Submission = sub
		if err := s.judgeTree(ctx, models, tree, req, grades, v); err != nil {
			return err
		}
	}
	for _, g := range paperbench.Graders() {
		var res paperbench.Result
		var err error
		if v.Disqualified {
			res, err = paperbench.Disqualified(tree, g, v.Monitor.Explanation())
		} else {
			res, err = paperbench.Score(tree, grades, g)
		}
		if err != nil {
			return err
		}
		if g == paperbench.GraderReportFailed {
			if !res.Valid {
				return fmt.Errorf("the judging of every one of %d leaves failed (first: %s): not the agent's score; retry",
					res.Leaves, res.Failed[0].Reason)
			}
			v.Failed = res.Failed
		}
		v.Scores = append(v.Scores, GraderScore{Grader: g, Score: res.Score, Valid: res.Valid, Failed: len(res.Failed)})
	}
	return nil
}

// leafJob is one leaf to grade.
type leafJob struct {
	leaf  *paperbench.Node
	input paperbench.JudgeInput
	twice bool
}

// judgeTree grades every leaf of tree: a leaf paperbench grades without a
// judge (AutoGrade) as it says, every other by the judge, and the leaves
// chosen to be judged twice by the second judge too; at most
// Config.Concurrency calls in flight. It fills grades and the verdict's
// records, judge use and agreement.
func (s *Suite) judgeTree(ctx context.Context, models bench.Models, tree *paperbench.Node, req paperbench.JudgeRequest,
	grades map[string]paperbench.LeafGrade, v *Verdict) error {
	var jobs []leafJob
	for _, l := range tree.Leaves() {
		req.LeafID = l.ID
		in, err := paperbench.BuildJudgeInput(req)
		if err != nil {
			return err
		}
		jobs = append(jobs, leafJob{leaf: l, input: in})
	}
	chooseTwice(jobs, s.cfg.DoubleJudged)
	records := make([]LeafRecord, len(jobs))
	firsts := make([]Judging, len(jobs))
	seconds := make([]*Judging, len(jobs))
	var tally usage
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var failure error
	sem := make(chan struct{}, s.cfg.Concurrency)
	ask := func(js JudgeSettings, msgs []paperbench.Message) (Judging, bool) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return Judging{}, false
		}
		defer func() { <-sem }()
		j, err := s.judgeOnce(ctx, models, js, msgs, &tally)
		if err != nil {
			once.Do(func() { failure = err; cancel() })
			return Judging{}, false
		}
		return j, true
	}
	for i, job := range jobs {
		records[i] = LeafRecord{ID: job.leaf.ID, Category: job.leaf.TaskCategory, Files: job.input.Files}
		if a := job.input.AutoGrade; a != nil {
			firsts[i] = Judging{Score: a.Score, Failed: a.Failed, Reason: job.input.AutoReason}
			records[i].Auto = true
			continue
		}
		if models == nil {
			return fmt.Errorf("leaf %s needs a judge and the scorer has no model access (a coordinator without a gateway)", job.leaf.ID)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, ok := ask(s.cfg.Judge, job.input.Messages)
			if !ok {
				return
			}
			firsts[i] = j
			if job.twice {
				if j2, ok := ask(s.cfg.second(), job.input.Messages); ok {
					seconds[i] = &j2
				}
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		return failure
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, job := range jobs {
		r := &records[i]
		r.Score, r.Failed, r.Reason, r.Explanation = firsts[i].Score, firsts[i].Failed, firsts[i].Reason, firsts[i].Explanation
		if r.Failed {
			r.Score = 0
		}
		grades[job.leaf.ID] = firsts[i].grade()
		if r.Auto {
			v.Auto++
		} else {
			v.Judged++
		}
		if seconds[i] != nil {
			r.Second = seconds[i]
			v.Agreement.count(firsts[i].grade(), seconds[i].grade())
		}
	}
	v.Grading = records
	v.Judge = tally.use(s.cfg.Prices)
	return nil
}

// chooseTwice marks the judged leaves to judge twice: those whose id
// hashes (SHA-256, first 8 bytes) below share of the range, and at least
// the lowest when share is not 0.
func chooseTwice(jobs []leafJob, share float64) {
	if share <= 0 {
		return
	}
	lowest, low := -1, uint64(math.MaxUint64)
	any := false
	for i := range jobs {
		if jobs[i].input.AutoGrade != nil {
			continue
		}
		h := sha256.Sum256([]byte(jobs[i].leaf.ID))
		x := binary.BigEndian.Uint64(h[:8])
		if share >= 1 || float64(x) < share*math.Exp2(64) {
			jobs[i].twice, any = true, true
		}
		if lowest < 0 || x < low {
			lowest, low = i, x
		}
	}
	if !any && lowest >= 0 {
		jobs[lowest].twice = true
	}
}

// usage tallies judge calls by model.
type usage struct {
	mu      sync.Mutex
	calls   int
	byModel map[string][2]int64
}

func (u *usage) add(model string, in, out int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.byModel == nil {
		u.byModel = map[string][2]int64{}
	}
	t := u.byModel[model]
	u.byModel[model] = [2]int64{t[0] + in, t[1] + out}
	u.calls++
}

// use sums the tally, priced when every model used has a price.
func (u *usage) use(prices map[string]Price) JudgeUse {
	u.mu.Lock()
	defer u.mu.Unlock()
	tallies := make([]judging.Tally, 0, len(u.byModel))
	for m, t := range u.byModel {
		tallies = append(tallies, judging.Tally{Model: m, In: t[0], Out: t[1]})
	}
	return judging.Priced(u.calls, tallies, prices)
}

// judgeOnce asks a judge about one leaf: its answer, parsed strictly
// (paperbench.ParseJudgeResponse), or a failed judging naming what was
// wrong with it. A call that fails is tried judgeTries times; then, or
// when ctx ends, it is an error (the scoring fails and is retried).
func (s *Suite) judgeOnce(ctx context.Context, models bench.Models, js JudgeSettings, msgs []paperbench.Message, tally *usage) (Judging, error) {
	body, err := judgeRequest(js, msgs)
	if err != nil {
		return Judging{}, err
	}
	resp, err := judging.Call(ctx, models, body, judgeTries, judgeRetryDelay)
	if err != nil {
		return Judging{}, fmt.Errorf("judge %s: %w", js.Model, err)
	}
	a, err := judging.ReadAnswer(resp)
	tally.add(js.Model, a.In, a.Out)
	if err != nil {
		return Judging{Failed: true, Reason: err.Error()}, nil
	}
	verdict, err := paperbench.ParseJudgeResponse(a.Content)
	if err != nil {
		return Judging{Failed: true, Reason: err.Error(), Explanation: clip(a.Content, maxExplanation)}, nil
	}
	return Judging{Score: verdict.Score, Explanation: clip(verdict.Explanation, maxExplanation)}, nil
}

// judgeRequest is the chat completions request of one judging.
func judgeRequest(js JudgeSettings, msgs []paperbench.Message) (json.RawMessage, error) {
	req := map[string]any{"model": js.Model, "messages": msgs}
	if js.Temperature != nil {
		req["temperature"] = *js.Temperature
	}
	if js.MaxTokens > 0 {
		req["max_completion_tokens"] = js.MaxTokens
	}
	if js.ReasoningEffort != "" {
		req["reasoning_effort"] = js.ReasoningEffort
	}
	return json.Marshal(req)
}
