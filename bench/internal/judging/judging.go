// Package judging holds what the families' LLM judges share: a judge
// model's price, the use of a scoring's judge calls (tokens and cost, as
// the answers report them), reading an OpenAI-style chat completion the
// gateway returns, and one call tried a bounded number of times.
//
// It is pure but for Call, which goes through the bench.Models it is
// given (the coordinator's gateway); it knows no family.
package judging

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/repronet/repronet/bench"
)

// Price is what a judge model costs, in dollars per million tokens.
type Price struct {
	Input  float64 `json:"input"`
	Output float64 `json:"output"`
}

// CheckPrices refuses a negative price or one that is not a number.
func CheckPrices(prices map[string]Price) error {
	for m, p := range prices {
		if !(p.Input >= 0 && p.Output >= 0) {
			return fmt.Errorf("config: prices[%q]: negative or not a number", m)
		}
	}
	return nil
}

// Use is what judge calls used, by the usage their answers report;
// CostUSD is that at the config's prices, nil when a model used has none
// (then Unpriced is set).
type Use struct {
	Calls        int      `json:"calls"`
	InputTokens  int64    `json:"input_tokens"`
	OutputTokens int64    `json:"output_tokens"`
	CostUSD      *float64 `json:"cost_usd,omitempty"`
	Unpriced     bool     `json:"unpriced,omitempty"`
}

// Add adds u's figures to j's: the cost stays only while every part with
// calls had one.
func (j *Use) Add(u Use) {
	if u.Calls == 0 {
		return
	}
	priced := !j.Unpriced && u.CostUSD != nil
	j.Calls += u.Calls
	j.InputTokens += u.InputTokens
	j.OutputTokens += u.OutputTokens
	if !priced {
		j.CostUSD, j.Unpriced = nil, true
		return
	}
	c := *u.CostUSD
	if j.CostUSD != nil {
		c += *j.CostUSD
	}
	j.CostUSD = &c
}

// Tally is one model's tokens; Priced sums tallies into a Use.
type Tally struct {
	Model   string
	In, Out int64
}

// Priced is calls' use of the tallied tokens, priced when every model used
// has a price.
func Priced(calls int, tallies []Tally, prices map[string]Price) Use {
	j := Use{Calls: calls}
	cost, priced := 0.0, true
	for _, t := range tallies {
		j.InputTokens += t.In
		j.OutputTokens += t.Out
		p, ok := prices[t.Model]
		if !ok {
			priced = false
			continue
		}
		cost += (float64(t.In)*p.Input + float64(t.Out)*p.Output) / 1e6
	}
	switch {
	case j.Calls == 0:
	case priced:
		j.CostUSD = &cost
	default:
		j.Unpriced = true
	}
	return j
}

// Answer is what a chat completion holds: the first choice's text, its
// tokens' log-probabilities as sent (OpenAI's logprobs.content; nil when
// none), and the tokens the answer reports.
type Answer struct {
	Content  string
	Logprobs json.RawMessage
	In, Out  int64
}

// ReadAnswer reads a chat completion. An answer without text (a refusal,
// no choice) is an error saying so; the usage is read all the same.
func ReadAnswer(resp json.RawMessage) (Answer, error) {
	var a struct {
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
				Refusal *string `json:"refusal"`
			} `json:"message"`
			Logprobs *struct {
				Content json.RawMessage `json:"content"`
			} `json:"logprobs"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(resp, &a); err != nil {
		return Answer{}, fmt.Errorf("judge answer is not a chat completion: %w", err)
	}
	out := Answer{In: a.Usage.Prompt, Out: a.Usage.Completion}
	switch {
	case len(a.Choices) == 0:
		return out, errors.New("judge answer has no choice")
	case a.Choices[0].Message.Refusal != nil && *a.Choices[0].Message.Refusal != "":
		return out, fmt.Errorf("the judge refused: %s", Clip(*a.Choices[0].Message.Refusal, 200))
	case a.Choices[0].Message.Content == nil:
		return out, fmt.Errorf("judge answer has no text (finish reason %q)", a.Choices[0].FinishReason)
	}
	out.Content = *a.Choices[0].Message.Content
	if lp := a.Choices[0].Logprobs; lp != nil && len(lp.Content) > 0 && string(lp.Content) != "null" {
		out.Logprobs = lp.Content
	}
	return out, nil
}

// Call sends one judge request, tried tries times in all, delay apart
// (doubling) while the call fails (the gateway or the provider refused);
// ctx's end stops it.
func Call(ctx context.Context, models bench.Models, body json.RawMessage, tries int, delay time.Duration) (json.RawMessage, error) {
	if models == nil {
		return nil, errors.New("no model access for the judge (the coordinator has no gateway)")
	}
	var last error
	for try := range max(tries, 1) {
		if try > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(delay << (try - 1)):
			}
		}
		resp, err := models.Chat(ctx, body)
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		last = err
	}
	return nil, fmt.Errorf("%d calls failed, last: %w", max(tries, 1), last)
}

// Clip bounds a text quoted in a record or an error.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Dollars shows a cost on a text board ("-" when there is none).
func Dollars(c *float64) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("$%.4f", *c)
}
