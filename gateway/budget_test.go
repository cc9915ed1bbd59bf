package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

func TestPerMillion(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		in, out, cached, write float64
		want                   Price
		err                    bool
	}{
		{"gpt-4.1", 2, 8, 0.5, 0, Price{Input: 2_000_000, Output: 8_000_000, CachedInput: 500_000}, false},
		{"cents", 0.075, 0.3, 0.0375, 0.09375, Price{Input: 75_000, Output: 300_000, CachedInput: 37_500, CacheWrite: 93_750}, false},
		{"a millionth", 0.000001, 0, 0, 0, Price{Input: 1}, false},
		{"finer than a millionth", 0.0000001, 0, 0, 0, Price{}, true},
		{"negative", -1, 0, 0, 0, Price{}, true},
		{"not a number", math.NaN(), 0, 0, 0, Price{}, true},
		{"over a million dollars", 0, 2e6, 0, 0, Price{}, true},
	} {
		got, err := PerMillion(tc.in, tc.out, tc.cached, tc.write)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: PerMillion = %+v, %v; want %+v, error %v", tc.name, got, err, tc.want, tc.err)
		}
	}
}

func TestCost(t *testing.T) {
	p := Price{Input: 2_000_000, Output: 8_000_000, CachedInput: 500_000, CacheWrite: 2_500_000, CacheWrite5m: 1_250_000,
		WebSearch: USD / 100, WebFetch: 7}
	for _, tc := range []struct {
		name string
		u    Usage
		want Money
	}{
		{"plain", Usage{Input: 1000, Output: 100}, 1000*2_000_000 + 100*8_000_000},
		{"cached", Usage{Input: 1000, CachedInput: 400, Output: 100}, 600*2_000_000 + 400*500_000 + 100*8_000_000},
		{"cache write", Usage{Input: 1000, CachedInput: 400, CacheWrite: 100, Output: 0}, 500*2_000_000 + 400*500_000 + 100*2_500_000},
		{"cache writes by lifetime", Usage{Input: 1000, CacheWrite: 300, CacheWrite5m: 200}, 700*2_000_000 + 100*2_500_000 + 200*1_250_000},
		{"server tool uses", Usage{Input: 10, Output: 1, WebSearches: 3, WebFetches: 2}, 10*2_000_000 + 8_000_000 + 3*10_000_000_000 + 2*7},
		{"saturates", Usage{Input: math.MaxInt64, Output: math.MaxInt64}, Money(math.MaxInt64)},
	} {
		if got := Cost(p, tc.u); got != tc.want {
			t.Errorf("%s: Cost = %d, want %d", tc.name, got, tc.want)
		}
	}
	// One dollar is exactly 1e12: a million tokens at $2/M cost $2.
	if got := Cost(p, Usage{Input: 1_000_000}); got != 2*USD || got.String() != "$2.000000" {
		t.Errorf("a million input tokens at $2/M cost %v", got)
	}
}

func TestUsageValidate(t *testing.T) {
	for _, tc := range []struct {
		u  Usage
		ok bool
	}{
		{Usage{Input: 10, Output: 5, CachedInput: 4, CacheWrite: 6}, true},
		{Usage{}, true},
		{Usage{Input: -1}, false},
		{Usage{Input: 10, Output: -5}, false},
		{Usage{Input: 10, CachedInput: 8, CacheWrite: 3}, false},
		{Usage{Input: 1, CachedInput: math.MaxInt64, CacheWrite: math.MaxInt64}, false},
		{Usage{Input: 10, CacheWrite: 6, CacheWrite5m: 6, WebSearches: 2}, true},
		{Usage{Input: 10, CacheWrite: 6, CacheWrite5m: 7}, false},
		{Usage{Input: 10, CacheWrite5m: -1}, false},
		{Usage{Input: 10, WebFetches: -1}, false},
	} {
		if err := tc.u.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v, want ok %v", tc.u, err, tc.ok)
		}
	}
}

func TestPlanCall(t *testing.T) {
	p := Price{Input: 1_000_000, Output: 4_000_000} // $1/M in, $4/M out
	shape := CallShape{InputTokens: 1000, Choices: 1, ModelMax: 8192, MinOutput: 16}
	in := Money(1000 * 1_000_000) // the input's worst cost: 1e9
	for _, tc := range []struct {
		name      string
		avail     Money
		shape     func(CallShape) CallShape
		price     Price
		maxOutput int64
		err       bool
	}{
		{"plenty: the model's max", USD, nil, p, 8192, false},
		{"plenty: the client's smaller request", USD, func(s CallShape) CallShape { s.Requested = 100; return s }, p, 100, false},
		{"what the rest pays for", in + 500*4_000_000 + 3_999_999, nil, p, 500, false},
		{"exactly the minimum", in + 16*4_000_000, nil, p, 16, false},
		{"one pico-dollar short of the minimum", in + 16*4_000_000 - 1, nil, p, 0, true},
		{"a small request below the minimum is fine", in + 5*4_000_000, func(s CallShape) CallShape { s.Requested = 5; return s }, p, 5, false},
		{"not even the input", in - 1, nil, p, 0, true},
		{"nothing left", 0, nil, p, 0, true},
		{"n choices share the rest", in + 3*100*4_000_000, func(s CallShape) CallShape { s.Choices = 3; return s }, p, 100, false},
		{"free output: the model's max", in, nil, Price{Input: 1_000_000}, 8192, false},
		{"cached price higher than input: the worst counts", 1000 * 3_000_000, nil, Price{Input: 1_000_000, CachedInput: 3_000_000, Output: 0}, 8192, false},
		{"cache write price is the worst", 1000*3_000_000 - 1, nil, Price{Input: 1_000_000, CacheWrite: 3_000_000}, 0, true},
		{"five-minute cache write price is the worst", 1000*3_000_000 - 1, nil, Price{Input: 1_000_000, CacheWrite5m: 3_000_000}, 0, true},
		{"fees come off before the output", in + USD/100 + 100*4_000_000, func(s CallShape) CallShape { s.Fees = USD / 100; return s }, p, 100, false},
		{"fees the budget cannot pay", in + USD/100 - 1, func(s CallShape) CallShape { s.Fees = USD / 100; return s }, p, 0, true},
	} {
		s := shape
		if tc.shape != nil {
			s = tc.shape(s)
		}
		plan, err := PlanCall(tc.avail, tc.price, s)
		if tc.err {
			var sf *Shortfall
			if !errors.As(err, &sf) || !errors.Is(err, ErrBudgetExhausted) || sf.Have != tc.avail || sf.Need <= tc.avail {
				t.Errorf("%s: got %+v, %v; want a shortfall naming %v left", tc.name, plan, err, tc.avail)
			}
			continue
		}
		if err != nil || plan.MaxOutput != tc.maxOutput {
			t.Errorf("%s: got %+v, %v; want max output %d", tc.name, plan, err, tc.maxOutput)
			continue
		}
		want := Money(s.InputTokens)*tc.price.WorstInput() + s.Fees + Money(plan.MaxOutput*s.Choices)*tc.price.Output
		if plan.Bound != want || plan.Bound > tc.avail {
			t.Errorf("%s: bound %v, want %v and at most %v", tc.name, plan.Bound, want, tc.avail)
		}
	}
	if _, err := PlanCall(USD, p, CallShape{Choices: 0, ModelMax: 1, MinOutput: 1}); err == nil || errors.Is(err, ErrBudgetExhausted) {
		t.Errorf("a shape with 0 choices: %v, want an error that is not exhaustion", err)
	}
}

// The proof by test that a budget is never exceeded. Calls keep coming,
// several in flight at once, at random prices and sizes, against three
// budgets shared by several attempts; providers report usage that is
// within the plan, far over it (ignoring max_tokens, over-reporting),
// invalid, or missing. After every step, every account holds Spent +
// Reserved <= Cap; at the end Spent <= Cap, the calls are eventually
// refused, and what was charged adds up.
func TestBudgetNeverExceeded(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		caps := map[string]Money{
			"group/g":      Money(rng.Int64N(int64(2 * USD))),
			"evaluation/e": Money(rng.Int64N(int64(USD))),
		}
		ledger := NewMemLedger()
		type flight struct {
			res  Reservation
			plan Plan
			p    Price
			s    CallShape
		}
		var inFlight []flight
		charged := map[string]Money{}
		refused := 0
		check := func(step int) {
			for k := range ledger.accounts {
				a := ledger.accounts[k]
				if a.Spent < 0 || a.Reserved < 0 || a.Spent+a.Reserved > a.Cap {
					t.Fatalf("seed %d step %d: account %s %+v breaks Spent + Reserved <= Cap", seed, step, k, a)
				}
			}
		}
		for step := range 400 {
			if len(inFlight) > 0 && (rng.IntN(3) == 0 || len(inFlight) > 4) {
				i := rng.IntN(len(inFlight))
				f := inFlight[i]
				inFlight = append(inFlight[:i], inFlight[i+1:]...)
				actual, honest := adversarialCost(rng, f.p, f.s, f.plan)
				if honest && actual > f.plan.Bound {
					t.Fatalf("seed %d: honest usage costs %v over the bound %v (%+v, %+v)", seed, actual, f.plan.Bound, f.p, f.s)
				}
				ch, over, err := ledger.Settle(context.Background(), f.res, actual)
				if err != nil {
					t.Fatalf("seed %d: settle: %v", seed, err)
				}
				if ch > f.plan.Bound || ch+over != max(actual, 0) {
					t.Fatalf("seed %d: reported %v under bound %v charged %v with overrun %v", seed, actual, f.plan.Bound, ch, over)
				}
				for _, k := range f.res.Accounts {
					charged[k] += ch
				}
				check(step)
				continue
			}
			p := Price{Input: Money(rng.Int64N(20_000_000)), Output: Money(rng.Int64N(80_000_000)),
				CachedInput: Money(rng.Int64N(10_000_000)), CacheWrite: Money(rng.Int64N(30_000_000)), CacheWrite5m: Money(rng.Int64N(30_000_000)),
				WebSearch: Money(1 + rng.Int64N(int64(USD/50)))}
			s := CallShape{InputTokens: rng.Int64N(200_000), Choices: 1 + rng.Int64N(3), Requested: rng.Int64N(3) * rng.Int64N(5000),
				ModelMax: 1 + rng.Int64N(64_000), MinOutput: 1 + rng.Int64N(32)}
			if rng.IntN(4) == 0 { // a call with server tools: their fees
				s.Fees = Money(rng.Int64N(6)) * p.WebSearch
			}
			attempt := "attempt/a" + string(rune('0'+rng.IntN(3)))
			refs := []AccountRef{{Key: attempt, Cap: Money(rng.Int64N(int64(USD / 2)))}, {Key: "evaluation/e", Cap: caps["evaluation/e"]}, {Key: "group/g", Cap: caps["group/g"]}}
			// An attempt's cap is fixed once given.
			if a, ok := ledger.accounts[attempt]; ok {
				refs[0].Cap = a.Cap
			}
			res, plan, err := ledger.Reserve(context.Background(), refs, func(avail Money) (Plan, error) { return PlanCall(avail, p, s) })
			if err != nil {
				if !errors.Is(err, ErrBudgetExhausted) {
					t.Fatalf("seed %d: reserve: %v", seed, err)
				}
				refused++
				continue
			}
			if plan.MaxOutput < 1 || plan.MaxOutput > s.ModelMax || (s.Requested > 0 && plan.MaxOutput > s.Requested) {
				t.Fatalf("seed %d: plan %+v for shape %+v", seed, plan, s)
			}
			inFlight = append(inFlight, flight{res, plan, p, s})
			check(step)
		}
		for _, f := range inFlight {
			actual, _ := adversarialCost(rng, f.p, f.s, f.plan)
			ch, _, _ := ledger.Settle(context.Background(), f.res, actual)
			for _, k := range f.res.Accounts {
				charged[k] += ch
			}
		}
		check(-1)
		for k, a := range ledger.accounts {
			if a.Reserved != 0 || a.Spent != charged[k] || a.Spent > a.Cap {
				t.Fatalf("seed %d: account %s ends %+v, charged %v", seed, k, a, charged[k])
			}
		}
		if refused == 0 {
			t.Fatalf("seed %d: 400 calls and none refused: the budgets never ran out", seed)
		}
	}
}

// adversarialCost is what a provider reports for a call planned as plan:
// honest usage within the plan, output past max_tokens, over-reported
// input, absurd counts, or (for a call without valid usage) the bound;
// honest says it is usage within the plan (which must cost at most the
// bound).
func adversarialCost(rng *rand.Rand, p Price, s CallShape, plan Plan) (cost Money, honest bool) {
	in := rng.Int64N(s.InputTokens + 1)
	switch rng.IntN(5) {
	case 0: // honest: cache writes of both lifetimes, server tool uses within the fees
		w := rng.Int64N(in + 1)
		u := Usage{Input: in, Output: rng.Int64N(plan.MaxOutput*s.Choices + 1), CacheWrite: w, CacheWrite5m: rng.Int64N(w + 1)}
		if p.WebSearch > 0 {
			u.WebSearches = rng.Int64N(int64(s.Fees/p.WebSearch) + 1)
		}
		return Cost(p, u), true
	case 1: // ignores max_tokens
		return Cost(p, Usage{Input: in, Output: plan.MaxOutput*s.Choices + 1 + rng.Int64N(100_000)}), false
	case 2: // over-reports the input
		return Cost(p, Usage{Input: s.InputTokens * 10, Output: plan.MaxOutput}), false
	case 3: // absurd
		return Cost(p, Usage{Input: math.MaxInt64, Output: math.MaxInt64}), false
	default: // no usage: the bound
		return plan.Bound, false
	}
}

// TestLedgerConcurrent: calls reserving and settling from many goroutines
// never take an account past its cap.
func TestLedgerConcurrent(t *testing.T) {
	l := NewMemLedger()
	p := Price{Input: 1_000_000, Output: 4_000_000}
	refs := []AccountRef{{Key: "attempt/a", Cap: USD / 100}, {Key: "group/g", Cap: USD / 200}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total Money
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				res, plan, err := l.Reserve(context.Background(), refs, func(avail Money) (Plan, error) {
					return PlanCall(avail, p, CallShape{InputTokens: 500, Choices: 1, ModelMax: 1000, MinOutput: 1})
				})
				if err != nil {
					continue
				}
				ch, _, _ := l.Settle(context.Background(), res, plan.Bound*2) // every provider over-reports
				mu.Lock()
				total += ch
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	g, _ := l.Balance(context.Background(), "group/g")
	a, _ := l.Balance(context.Background(), "attempt/a")
	if g.Spent > g.Cap || a.Spent != total || g.Spent != total || g.Reserved != 0 {
		t.Fatalf("group %+v, attempt %+v, charged %v", g, a, total)
	}
	if g.Cap-g.Spent > Money(500*1_000_000+4_000_000) {
		t.Fatalf("group left with %v, enough for another minimal call", g.Cap-g.Spent)
	}
}

func FuzzPlanCall(f *testing.F) {
	f.Add(int64(USD), int64(1_000_000), int64(4_000_000), int64(0), int64(0), int64(1000), int64(1), int64(0), int64(8192), int64(16))
	f.Fuzz(func(t *testing.T, avail, in, out, cached, write, tokens, choices, requested, modelMax, minOut int64) {
		p := Price{Input: Money(in), Output: Money(out), CachedInput: Money(cached), CacheWrite: Money(write), CacheWrite5m: Money(write / 2)}
		if in < 0 || out < 0 || cached < 0 || write < 0 {
			return
		}
		s := CallShape{InputTokens: tokens, Choices: choices, Requested: requested, ModelMax: modelMax, MinOutput: minOut, Fees: Money(cached)}
		plan, err := PlanCall(Money(avail), p, s)
		if err != nil {
			return
		}
		if plan.Bound > max(Money(avail), 0) || plan.Bound < 0 {
			t.Fatalf("bound %v over avail %v (%+v, %+v)", plan.Bound, avail, p, s)
		}
		if plan.MaxOutput < 1 || plan.MaxOutput > modelMax || (requested > 0 && plan.MaxOutput > requested) {
			t.Fatalf("max output %d for %+v", plan.MaxOutput, s)
		}
		if plan.MaxOutput < min(minOut, modelMax, max(requested, 0)) && requested > 0 {
			t.Fatalf("max output %d below the minimum for %+v", plan.MaxOutput, s)
		}
	})
}

// FuzzLedger runs a sequence of reservations and settlements read from
// the input and checks the accounts after each.
func FuzzLedger(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Fuzz(func(t *testing.T, ops []byte) {
		l := NewMemLedger()
		var open []Reservation
		refs := []AccountRef{{Key: "attempt/a", Cap: 1 << 40}, {Key: "group/g", Cap: 1 << 39}}
		for len(ops) >= 9 {
			op, v := ops[0], int64(binary.LittleEndian.Uint64(ops[1:9]))
			ops = ops[9:]
			if op%2 == 0 || len(open) == 0 {
				res, _, err := l.Reserve(context.Background(), refs, func(avail Money) (Plan, error) {
					b := Money(v) % (avail + 1)
					if b < 0 {
						b = -b
					}
					return Plan{MaxOutput: 1, Bound: b}, nil
				})
				if err == nil {
					open = append(open, res)
				}
			} else {
				i := int(op) % len(open)
				if _, _, err := l.Settle(context.Background(), open[i], Money(v)); err != nil {
					t.Fatal(err)
				}
				open = append(open[:i], open[i+1:]...)
			}
			for k, a := range l.accounts {
				if a.Spent < 0 || a.Reserved < 0 || a.Spent+a.Reserved > a.Cap {
					t.Fatalf("account %s %+v", k, a)
				}
			}
		}
	})
}

// A durable ledger: every change reaches storage, a reservation is
// returned only once durable (and refused, released, when it cannot be),
// and a restart counts what calls in flight held as spent, so the cap
// holds across the crash.
func TestLedgerPersist(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	stored := map[string]Account{}
	var fail error
	persist := func(changed map[string]Account) func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		err := fail
		if err == nil {
			for k, a := range changed {
				stored[k] = a
			}
		}
		return func(context.Context) error { return err }
	}
	l := NewMemLedger(WithPersist(persist))
	p := Price{Input: 1_000_000, Output: 4_000_000}
	refs := []AccountRef{{Key: "attempt/a", Cap: USD / 100}}
	plan := func(avail Money) (Plan, error) {
		return PlanCall(avail, p, CallShape{InputTokens: 500, Choices: 1, ModelMax: 1000, MinOutput: 1})
	}
	res, pl, err := l.Reserve(ctx, refs, plan)
	if err != nil {
		t.Fatal(err)
	}
	if got := stored["attempt/a"]; got.Reserved != pl.Bound {
		t.Fatalf("reservation not stored before Reserve returned: %+v", got)
	}
	// The coordinator dies with the call in flight: after a restart the
	// reservation counts as spent.
	again := NewMemLedger(WithPersist(persist))
	again.Restore(map[string]Account{"attempt/a": stored["attempt/a"]})
	if a, _ := again.Balance(ctx, "attempt/a"); a.Spent != pl.Bound || a.Reserved != 0 {
		t.Fatalf("after a restart %+v, want the reservation spent", a)
	}
	if _, _, err := l.Settle(ctx, res, pl.Bound/2); err != nil {
		t.Fatal(err)
	}
	if got := stored["attempt/a"]; got.Spent != pl.Bound/2 || got.Reserved != 0 {
		t.Fatalf("settlement not stored: %+v", got)
	}
	// Storage refuses: the call is refused and nothing stays held.
	mu.Lock()
	fail = errors.New("disk full")
	mu.Unlock()
	if _, _, err := l.Reserve(ctx, refs, plan); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("reserve with storage refusing: %v", err)
	}
	if a, _ := l.Balance(ctx, "attempt/a"); a.Reserved != 0 || a.Spent != pl.Bound/2 {
		t.Fatalf("a refused reservation left %+v", a)
	}
}
