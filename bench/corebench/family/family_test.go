package family

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
)

// TestScoreOutputs: a report the job did not return is graded as empty,
// all wrong (the agent's doing); a report the coordinator could not read
// is the scorer's failure, an error, so that scoring is retried and never
// counted against the agent.
func TestScoreOutputs(t *testing.T) {
	def, err := Def("sample", sample.Tasks(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New().Open(def)
	if err != nil {
		t.Fatal(err)
	}
	task := s.Tasks()[0]
	score := func(out func(context.Context, string) ([]byte, error)) (bench.Score, error) {
		return s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: "easy", Stage: Stage, Outcome: "ok", Output: out})
	}
	sc, err := score(func(context.Context, string) ([]byte, error) {
		return nil, fmt.Errorf("report.json: %w: missing", bench.ErrNotReturned)
	})
	if err != nil || sc.Comparable.Grading == nil || sc.Comparable.Grading.Pass || sc.Value != 0 {
		t.Fatalf("missing report: %+v, %v", sc, err)
	}
	var v struct{ Detail string }
	if json.Unmarshal(sc.Verdict, &v); v.Detail == "" {
		t.Errorf("missing report: no detail in %s", sc.Verdict)
	}
	store := errors.New("badger: file closed")
	if _, err := score(func(context.Context, string) ([]byte, error) { return nil, store }); !errors.Is(err, store) {
		t.Fatalf("unreadable store: %v, want the store's error", err)
	}
}

// TestRecipeEnvironment: at Medium, and only there, the rollout runs in
// the capsule's environment (its environment/Dockerfile, if the capsule
// has one, built with environment/ as context), the agent's image at
// /agent; the recipe passes the one validator nodes apply.
func TestRecipeEnvironment(t *testing.T) {
	def, err := Def("sample-medium", sample.MediumTasks(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New().Open(def)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := cid.Decode("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")
	task := s.Tasks()[0]
	for _, level := range []string{"easy", "medium", "hard"} {
		r, err := s.Recipe(bench.RecipeInput{Task: task, Variant: level, Stage: Stage, Image: c, Content: map[string]cid.Cid{task.ID: c},
			Limits: &proto.Limits{CpuMillis: 1000, MemoryBytes: 4 << 30, WallSeconds: 60}})
		if err != nil {
			t.Fatal(err)
		}
		if err := recipe.Validate(r); err != nil {
			t.Fatalf("%s: %v", level, err)
		}
		env := r.GetEnvironment()
		want := level == "medium"
		if (env != nil) != want {
			t.Fatalf("%s: environment %v", level, env)
		}
		if want && (env.GetDockerfile() != task.ID+"/environment/Dockerfile" || env.GetContext() != task.ID+"/environment" ||
			env.GetImageMount() != AgentMount || !env.GetIfPresent()) {
			t.Fatalf("medium: environment %v", env)
		}
	}
}
