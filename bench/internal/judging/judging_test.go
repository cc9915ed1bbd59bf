package judging

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestPricedAndAdd(t *testing.T) {
	prices := map[string]Price{"a": {Input: 1, Output: 4}}
	u := Priced(2, []Tally{{Model: "a", In: 1_000_000, Out: 500_000}}, prices)
	if u.Calls != 2 || u.CostUSD == nil || *u.CostUSD != 3 || u.Unpriced {
		t.Fatalf("priced: %+v", u)
	}
	v := Priced(1, []Tally{{Model: "b", In: 10, Out: 1}}, prices)
	if v.CostUSD != nil || !v.Unpriced {
		t.Fatalf("unpriced model: %+v", v)
	}
	sum := u
	sum.Add(Use{})
	if *sum.CostUSD != 3 || sum.Calls != 2 {
		t.Fatalf("adding nothing: %+v", sum)
	}
	sum.Add(v)
	if sum.Calls != 3 || sum.CostUSD != nil || !sum.Unpriced || sum.InputTokens != 1_000_010 {
		t.Fatalf("a part without a price: %+v", sum)
	}
	if err := CheckPrices(map[string]Price{"x": {Input: -1}}); err == nil {
		t.Error("a negative price passes")
	}
}

func TestReadAnswer(t *testing.T) {
	a, err := ReadAnswer(json.RawMessage(`{"choices":[{"message":{"content":"<rating>4</rating>"},"logprobs":{"content":[{"token":"4","logprob":-0.1}]}}],"usage":{"prompt_tokens":7,"completion_tokens":3}}`))
	if err != nil || a.Content != "<rating>4</rating>" || a.In != 7 || a.Out != 3 || !strings.Contains(string(a.Logprobs), `"4"`) {
		t.Fatalf("%+v %v", a, err)
	}
	a, err = ReadAnswer(json.RawMessage(`{"choices":[{"message":{"content":"x"},"logprobs":null}]}`))
	if err != nil || a.Logprobs != nil {
		t.Fatalf("no logprobs: %+v %v", a, err)
	}
	for _, bad := range []string{`{"choices":[]}`, `{"choices":[{"message":{"refusal":"no"}}]}`, `{"choices":[{"message":{}}]}`, `[`} {
		if _, err := ReadAnswer(json.RawMessage(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

type flaky struct{ fails, calls int }

func (f *flaky) Chat(context.Context, json.RawMessage) (json.RawMessage, error) {
	f.calls++
	if f.calls <= f.fails {
		return nil, errors.New("busy")
	}
	return json.RawMessage(`{}`), nil
}

func TestCall(t *testing.T) {
	f := &flaky{fails: 2}
	if _, err := Call(context.Background(), f, nil, 3, 0); err != nil || f.calls != 3 {
		t.Fatalf("two failures then an answer: %v after %d calls", err, f.calls)
	}
	f = &flaky{fails: 5}
	if _, err := Call(context.Background(), f, nil, 3, 0); err == nil || !strings.Contains(err.Error(), "busy") || f.calls != 3 {
		t.Fatalf("always failing: %v after %d calls", err, f.calls)
	}
	if _, err := Call(context.Background(), nil, nil, 3, 0); err == nil {
		t.Fatal("no models: no error")
	}
}
