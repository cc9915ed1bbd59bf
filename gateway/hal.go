package gateway

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/repronet/repronet/internal/pystr"
)

// This file turns a trajectory into the fields of HAL's upload
// (princeton-pli/hal-harness, BaseBenchmark.process_results):
// raw_logging_results entries, total_usage, total_cost and the first and
// last call's timestamps. HAL's leaderboard accepts an upload only when
// raw_logging_results is a list whose every entry has weave_task_id,
// inputs and outputs (check_upload_structure); HAL's harness and tools
// read an entry as a Weave call: inputs (the request: model, messages,
// tools), output (the answer: choices or content, usage), summary.usage
// per model, summary.weave.latency_ms, started_at, created_timestamp. It
// is pure: records and bodies in, HAL's shapes out.

// HALCall is one entry of raw_logging_results.
type HALCall struct {
	ID          string  `json:"id"`
	ProjectID   string  `json:"project_id"`
	OpName      string  `json:"op_name"`
	DisplayName string  `json:"display_name"`
	TraceID     string  `json:"trace_id"`
	ParentID    *string `json:"parent_id"`
	StartedAt   string  `json:"started_at"`
	EndedAt     string  `json:"ended_at"`
	// CreatedTimestamp is the call's start in Unix seconds.
	CreatedTimestamp float64        `json:"created_timestamp"`
	WeaveTaskID      string         `json:"weave_task_id"`
	Attributes       map[string]any `json:"attributes"`
	// Inputs is the request as the agent sent it; Output the answer.
	Inputs json.RawMessage `json:"inputs"`
	Output json.RawMessage `json:"output"`
	// Outputs are the answer's texts, one per choice (the leaderboard's
	// own field).
	Outputs   HALOutputs `json:"outputs"`
	Exception *string    `json:"exception"`
	Summary   HALSummary `json:"summary"`
}

// HALOutputs are an answer's texts.
type HALOutputs struct {
	Choices []string `json:"choices"`
}

// HALSummary is a Weave call's summary: usage by model, latency.
type HALSummary struct {
	Usage map[string]map[string]any `json:"usage"`
	Weave HALWeave                  `json:"weave"`
}

// HALWeave is the summary's weave part.
type HALWeave struct {
	Status    string `json:"status"`
	LatencyMS int64  `json:"latency_ms"`
}

// HALTokenUsage is one model's total_usage entry; PromptTokens counts
// cache reads but not cache writes (HAL's _normalize_usage).
type HALTokenUsage struct {
	PromptTokens             int64 `json:"prompt_tokens"`
	CompletionTokens         int64 `json:"completion_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// HALLatency is a task's first and last call (results.latencies).
type HALLatency struct {
	FirstCallTimestamp string  `json:"first_call_timestamp"`
	LastCallTimestamp  string  `json:"last_call_timestamp"`
	TotalTime          float64 `json:"total_time"`
}

// TrajectoryCall is a call record with its bodies: the request as the
// client sent it and the answer.
type TrajectoryCall struct {
	Call
	RequestBody, ResponseBody []byte
}

// HALTrajectory is what one attempt's trajectory gives HAL's upload.
// Its JSON names are the upload's: raw_logging_results, total_usage,
// total_cost and latency (one task's entry of results.latencies).
type HALTrajectory struct {
	Calls []HALCall                `json:"raw_logging_results"`
	Usage map[string]HALTokenUsage `json:"total_usage"`
	// CostUSD is the total cost of the attempt's calls (a call without
	// reported usage counts at its bound).
	CostUSD float64 `json:"total_cost"`
	// Latency is nil when no call was answered.
	Latency *HALLatency `json:"latency,omitempty"`
}

// ToHAL converts one attempt's trajectory for task (HAL's
// weave_task_id) into HAL's fields. Calls refused by the gateway or the
// provider count toward cost (a call the provider got but never answered
// counts at its bound) but give no raw logging entry.
func ToHAL(task string, calls []TrajectoryCall) (HALTrajectory, error) {
	out := HALTrajectory{Calls: []HALCall{}, Usage: map[string]HALTokenUsage{}}
	var cost Money
	var first, last time.Time
	for i, c := range calls {
		cost = Money(add(int64(cost), int64(max(c.Cost, 0))))
		if c.Status != 200 || c.ResponseBody == nil || c.API == CallAnthropicCountTokens {
			continue // token counts are no model call of HAL's
		}
		if c.UsageReported {
			t := out.Usage[c.Model]
			t.PromptTokens = add(t.PromptTokens, c.Usage.Input-c.Usage.CacheWrite)
			t.CompletionTokens = add(t.CompletionTokens, c.Usage.Output)
			t.CacheReadInputTokens = add(t.CacheReadInputTokens, c.Usage.CachedInput)
			t.CacheCreationInputTokens = add(t.CacheCreationInputTokens, c.Usage.CacheWrite)
			out.Usage[c.Model] = t
		}
		if first.IsZero() || c.Started.Before(first) {
			first = c.Started
		}
		if c.Started.After(last) {
			last = c.Started
		}
		h, err := halCall(task, c)
		if err != nil {
			return HALTrajectory{}, fmt.Errorf("call %d (%s): %w", i, c.ID, err)
		}
		out.Calls = append(out.Calls, h)
	}
	slices.SortStableFunc(out.Calls, func(a, b HALCall) int {
		switch {
		case a.CreatedTimestamp < b.CreatedTimestamp:
			return -1
		case a.CreatedTimestamp > b.CreatedTimestamp:
			return 1
		}
		return 0
	})
	out.CostUSD = cost.USDValue()
	if !first.IsZero() {
		out.Latency = &HALLatency{FirstCallTimestamp: pystr.Isoformat(first), LastCallTimestamp: pystr.Isoformat(last),
			TotalTime: last.Sub(first).Seconds()}
	}
	return out, nil
}

func halCall(task string, c TrajectoryCall) (HALCall, error) {
	op := "openai.chat.completions.create"
	texts := chatChoiceTexts(c.ResponseBody)
	usage := map[string]any{"requests": 1}
	if c.API == CallAnthropicMessages {
		op = "anthropic.Messages.create"
		texts = messagesTexts(c.ResponseBody)
		if c.UsageReported {
			usage["input_tokens"] = c.Usage.Input - c.Usage.CachedInput - c.Usage.CacheWrite
			usage["output_tokens"] = c.Usage.Output
			usage["cache_read_input_tokens"] = c.Usage.CachedInput
			usage["cache_creation_input_tokens"] = c.Usage.CacheWrite
		}
	} else if c.API == CallGeminiGenerate || c.API == CallGeminiCountTokens {
		op = "google.genai.models.generate_content"
		if c.API == CallGeminiCountTokens {
			op = "google.genai.models.count_tokens"
		}
		texts = geminiTexts(c.ResponseBody)
		if c.UsageReported {
			usage["prompt_token_count"] = c.Usage.Input
			usage["candidates_token_count"] = c.Usage.Output
			usage["cached_content_token_count"] = c.Usage.CachedInput
			usage["total_token_count"] = add(c.Usage.Input, c.Usage.Output)
		}
	} else {
		if c.API == CallOpenAIResponses {
			op = "openai.responses.create"
			texts = responsesTexts(c.ResponseBody)
		}
		if c.UsageReported {
			usage["prompt_tokens"] = c.Usage.Input
			usage["completion_tokens"] = c.Usage.Output
			usage["total_tokens"] = add(c.Usage.Input, c.Usage.Output)
			usage["prompt_tokens_details"] = map[string]int64{"cached_tokens": c.Usage.CachedInput}
		}
	}
	var exception *string
	if c.Error != "" {
		exception = ptr(c.Error)
	}
	return HALCall{
		ID: c.ID, ProjectID: "repronet/" + c.Evaluation, OpName: op, DisplayName: op, TraceID: c.Attempt,
		StartedAt: pystr.Isoformat(c.Started), EndedAt: pystr.Isoformat(c.Ended),
		CreatedTimestamp: float64(c.Started.UnixMicro()) / 1e6, WeaveTaskID: task,
		Attributes: map[string]any{"weave_task_id": task, "repronet": map[string]any{
			"attempt": c.Attempt, "seq": c.Seq, "request": c.Request, "response": c.Response,
			"cost_usd": c.Cost.USDValue(), "charged_usd": c.Charged.USDValue(), "usage_reported": c.UsageReported,
			"first_token_ms": c.FirstTokenMS}},
		Inputs:    jsonOrString(c.RequestBody),
		Output:    jsonOrString(c.ResponseBody),
		Outputs:   HALOutputs{Choices: texts},
		Exception: exception,
		Summary: HALSummary{Usage: map[string]map[string]any{c.Model: usage},
			Weave: HALWeave{Status: "success", LatencyMS: int64(c.TotalMS)}},
	}, nil
}

// jsonOrString is b if it is JSON, else b as a JSON string.
func jsonOrString(b []byte) json.RawMessage {
	if json.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b))
	return s
}
