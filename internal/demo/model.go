package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/hal"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/modelsim"
)

// The reference agent in the demo: the gateway in front of the scripted
// model server or a real provider, the agent's registration and its
// evaluation, and the HAL export of the demo's evaluations.

// ScriptedLabel is the model the reference agent declares on the board
// when it runs against the scripted server: not a real model.
const ScriptedLabel = ScriptedModel + " (scripted)"

// referenceRun is the reference agent's model side in a demo.
type referenceRun struct {
	gateway *gateway.Config
	// model is the model the agent calls, label what the board shows.
	model, label, boardModel string
	budget                   float64
	sim                      *modelsim.Server
}

// startReference makes the gateway's configuration for m, starting the
// scripted model server when m has no URL.
func startReference(m Model) (*referenceRun, error) {
	r := &referenceRun{budget: m.AttemptUSD}
	if r.budget == 0 {
		r.budget = 1
	}
	provider := gateway.Provider{Name: "provider", API: gateway.APIOpenAI, BaseURL: m.URL, Key: m.Key}
	price := m.Price
	r.model, r.boardModel = m.Name, m.Name
	if m.Gateway != nil {
		r.gateway, r.model, r.boardModel = m.Gateway, m.Name, m.Name
		r.label = fmt.Sprintf("reference agent on %s, as the configuration's providers serve it (the keys stay with the coordinator's gateway)", m.Name)
		return r, nil
	}
	if m.Scripted() {
		script, err := SampleScript()
		if err != nil {
			return nil, err
		}
		// The server's key is made here and known to the gateway only.
		var kb [16]byte
		if _, err := rand.Read(kb[:]); err != nil {
			return nil, fmt.Errorf("demo: scripted model key: %w", err)
		}
		key := "sk-demo-scripted-" + hex.EncodeToString(kb[:])
		if r.sim, err = modelsim.Start(script, modelsim.Options{APIKey: key}); err != nil {
			return nil, fmt.Errorf("demo: scripted model server: %w", err)
		}
		provider = gateway.Provider{Name: "scripted", API: gateway.APIOpenAI, BaseURL: r.sim.URL() + "/v1", Key: key}
		price, r.model, r.boardModel = ScriptedPrice, ScriptedModel, ScriptedLabel
		r.label = fmt.Sprintf("reference agent on %s: a scripted model server on %s stands in for a provider (not a real model)",
			ScriptedModel, r.sim.URL())
	} else {
		r.label = fmt.Sprintf("reference agent on %s at %s (the key stays with the coordinator's gateway)", m.Name, m.URL)
	}
	r.gateway = &gateway.Config{Providers: []gateway.Provider{provider},
		Models: []gateway.Model{{Name: r.model, Provider: provider.Name, Price: price, MaxOutput: 4096}}}
	return r, nil
}

func (r *referenceRun) close() {
	if r.sim != nil {
		r.sim.Close()
	}
}

// register builds the reference agent's image from agentBinary and
// registers it.
func (r *referenceRun) register(ctx context.Context, coord *coordinator.Coordinator, agentBinary string) error {
	img, err := ReferenceImage(BusyboxPath, agentBinary)
	if err != nil {
		return err
	}
	_, err = coord.AddAgentWith(ctx, coordinator.AgentInfo{Name: ReferenceAgent, Model: r.boardModel}, bytes.NewReader(img))
	return err
}

// evaluation is the reference agent's evaluation: a stochastic agent, one
// replica a run, each attempt's model cost capped.
func (r *referenceRun) evaluation(levels []string) coordinator.Evaluation {
	return coordinator.Evaluation{Suite: SuiteName, Agent: ReferenceAgent, Levels: levels, Runs: 1, Replicas: 1,
		Env: []string{"MODEL=" + r.model}, Models: []string{r.model}, Budget: core.Budget{AttemptUSD: r.budget}}
}

// WriteHAL writes HAL's upload files of coord's evaluations into dir,
// with the trajectories of every validated run (bench/corebench/hal), and
// returns their paths.
func WriteHAL(ctx context.Context, coord *coordinator.Coordinator, dir string) ([]string, error) {
	entries, err := family.Entries(coord.LeaderboardEntries())
	if err != nil {
		return nil, fmt.Errorf("demo: HAL export: %w", err)
	}
	runs, err := coord.HALRuns(ctx, accounts.Principal{Scope: accounts.ScopeAdmin}, "", "", "")
	if err != nil {
		return nil, fmt.Errorf("demo: HAL export: %w", err)
	}
	// The API's JSON is the export's input: the same bytes a user's
	// `repronet leaderboard --hal` reads.
	b, err := json.Marshal(runs)
	if err != nil {
		return nil, fmt.Errorf("demo: HAL export: %w", err)
	}
	var trajectories []hal.Trajectory
	if err := json.Unmarshal(b, &trajectories); err != nil {
		return nil, fmt.Errorf("demo: HAL export: %w", err)
	}
	uploads, errs := hal.Export(entries, hal.Options{RunIDPrefix: "repronet_demo_", Trajectories: trajectories})
	if len(errs) > 0 {
		return nil, fmt.Errorf("demo: HAL export: %d entries refused, first: %w", len(errs), errs[0])
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("demo: HAL export: %w", err)
	}
	var files []string
	for _, u := range uploads {
		b, err := json.MarshalIndent(u, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("demo: HAL export: %s: %w", u.FileName(), err)
		}
		p := filepath.Join(dir, u.FileName())
		if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
			return nil, fmt.Errorf("demo: HAL export: %w", err)
		}
		files = append(files, p)
	}
	return files, nil
}
