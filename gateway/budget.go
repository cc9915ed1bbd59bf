package gateway

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// This file is the gateway's arithmetic: money, prices, the cost of a
// call, the plan that bounds a call by the money left, and the accounts a
// call is charged to. It is pure: no clock, no I/O, no locks.

// Money is an amount in pico-dollars (1e-12 USD): exact for every price
// quoted to a millionth of a dollar per million tokens, and up to about
// 9.2 million dollars.
type Money int64

// Money units.
const (
	PicoUSD Money = 1
	USD     Money = 1_000_000_000_000
	// Unlimited is a cap that never binds.
	Unlimited Money = math.MaxInt64
	// maxDollars bounds a price per million tokens and a budget.
	maxDollars = 1_000_000
)

// Dollars converts a dollar amount (a price per million tokens, a budget)
// to Money, to the nearest pico-dollar. It refuses what is negative, not
// a number, or over a million dollars.
func Dollars(usd float64) (Money, error) {
	if math.IsNaN(usd) || usd < 0 || usd > maxDollars {
		return 0, fmt.Errorf("amount %v USD is not in [0, %d]", usd, maxDollars)
	}
	return Money(math.Round(usd * float64(USD))), nil
}

// USDValue is m in dollars.
func (m Money) USDValue() float64 { return float64(m) / float64(USD) }

func (m Money) String() string {
	if m == Unlimited {
		return "unlimited"
	}
	return fmt.Sprintf("$%.6f", m.USDValue())
}

// mul is a*b for non-negative a and b, saturating at math.MaxInt64.
func mul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// add is a+b for non-negative a and b, saturating at math.MaxInt64.
func add(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

// Price is what a model's tokens cost, per token. Every field is Money
// per token; PerMillion builds one from dollars per million tokens.
type Price struct {
	// Input is an input token not read from the provider's cache.
	Input Money `json:"input"`
	// Output is an output token (reasoning tokens included).
	Output Money `json:"output"`
	// CachedInput is an input token read from the cache.
	CachedInput Money `json:"cached_input"`
	// CacheWrite is an input token written to the cache (Anthropic's
	// cache_creation_input_tokens) for the longest lifetime allowed, or
	// for a lifetime the provider did not say.
	CacheWrite Money `json:"cache_write"`
	// CacheWrite5m is an input token the provider says it wrote to the
	// cache for five minutes (Anthropic's
	// cache_creation.ephemeral_5m_input_tokens).
	CacheWrite5m Money `json:"cache_write_5m,omitempty"`
	// WebSearch and WebFetch are one use of a provider-side tool
	// (Anthropic's usage.server_tool_use web_search_requests and
	// web_fetch_requests), on top of the tokens it adds.
	WebSearch Money `json:"web_search,omitempty"`
	WebFetch  Money `json:"web_fetch,omitempty"`
}

// perMillion is dollars per million tokens (or per million uses) as
// Money per token: exact, since prices are quoted to 1e-6 dollars.
func perMillion(usd float64) (Money, error) {
	m, err := Dollars(usd)
	if err != nil {
		return 0, err
	}
	if m%1_000_000 != 0 {
		return 0, fmt.Errorf("%v USD per million is not a whole number of millionths of a dollar", usd)
	}
	return m / 1_000_000, nil
}

// PerMillion is the Price of dollars per million tokens: input, output,
// cached input and cache write.
func PerMillion(input, output, cachedInput, cacheWrite float64) (Price, error) {
	var p Price
	for _, f := range []struct {
		name string
		usd  float64
		to   *Money
	}{{"input", input, &p.Input}, {"output", output, &p.Output}, {"cached input", cachedInput, &p.CachedInput}, {"cache write", cacheWrite, &p.CacheWrite}} {
		m, err := Dollars(f.usd)
		if err != nil {
			return Price{}, fmt.Errorf("%s price: %w", f.name, err)
		}
		// Dollars per million tokens is pico-dollars per token times 1e-6:
		// m/1e6 is exact because prices are quoted to 1e-6 dollars.
		*f.to = m / 1_000_000
		if m%1_000_000 != 0 {
			return Price{}, fmt.Errorf("%s price %v USD per million tokens is not a whole number of millionths of a dollar", f.name, f.usd)
		}
	}
	return p, nil
}

// WorstInput is the most one input token can cost, whatever the cache
// does with it.
func (p Price) WorstInput() Money { return max(p.Input, p.CachedInput, p.CacheWrite, p.CacheWrite5m) }

// Usage is a call's token counts as the provider reported them. Input
// counts every input token: read from the cache, written to it or
// neither. CacheWrite5m are the cache writes the provider says lasted
// five minutes (part of CacheWrite; the rest is priced at the longest
// lifetime). WebSearches and WebFetches count uses of provider-side
// tools.
type Usage struct {
	Input        int64 `json:"input_tokens"`
	Output       int64 `json:"output_tokens"`
	CachedInput  int64 `json:"cached_input_tokens,omitempty"`
	CacheWrite   int64 `json:"cache_write_tokens,omitempty"`
	CacheWrite5m int64 `json:"cache_write_5m_tokens,omitempty"`
	WebSearches  int64 `json:"web_searches,omitempty"`
	WebFetches   int64 `json:"web_fetches,omitempty"`
}

// Add is u and v summed (saturating).
func (u Usage) Add(v Usage) Usage {
	return Usage{Input: add(u.Input, v.Input), Output: add(u.Output, v.Output),
		CachedInput: add(u.CachedInput, v.CachedInput), CacheWrite: add(u.CacheWrite, v.CacheWrite),
		CacheWrite5m: add(u.CacheWrite5m, v.CacheWrite5m), WebSearches: add(u.WebSearches, v.WebSearches),
		WebFetches: add(u.WebFetches, v.WebFetches)}
}

// Validate refuses usage no provider should report: negative counts, or
// more cached and cache-written tokens than input tokens.
func (u Usage) Validate() error {
	switch {
	case u.Input < 0 || u.Output < 0 || u.CachedInput < 0 || u.CacheWrite < 0 || u.CacheWrite5m < 0 || u.WebSearches < 0 || u.WebFetches < 0:
		return fmt.Errorf("usage %+v has a negative count", u)
	case u.CacheWrite5m > u.CacheWrite:
		return fmt.Errorf("usage %+v: more five-minute cache writes (%d) than cache writes (%d)", u, u.CacheWrite5m, u.CacheWrite)
	case add(u.CachedInput, u.CacheWrite) > u.Input:
		return fmt.Errorf("usage %+v: cached (%d) and cache-write (%d) tokens exceed the input tokens (%d)",
			u, u.CachedInput, u.CacheWrite, u.Input)
	}
	return nil
}

// Cost is what u costs at p. u must be valid.
func Cost(p Price, u Usage) Money {
	fresh := u.Input - u.CachedInput - u.CacheWrite
	c := mul(fresh, int64(p.Input))
	c = add(c, mul(u.CachedInput, int64(p.CachedInput)))
	c = add(c, mul(u.CacheWrite-u.CacheWrite5m, int64(p.CacheWrite)))
	c = add(c, mul(u.CacheWrite5m, int64(p.CacheWrite5m)))
	c = add(c, mul(u.Output, int64(p.Output)))
	c = add(c, mul(u.WebSearches, int64(p.WebSearch)))
	c = add(c, mul(u.WebFetches, int64(p.WebFetch)))
	return Money(c)
}

// CallShape is what bounds one call before it is made.
type CallShape struct {
	// InputTokens is an upper bound on the call's input tokens
	// (InputBound).
	InputTokens int64
	// Choices is how many completions the call asks for (OpenAI's n); at
	// least 1.
	Choices int64
	// Requested is the output bound the client asked for; 0: none.
	Requested int64
	// ModelMax is the most output tokens the gateway asks the model for.
	ModelMax int64
	// MinOutput is the fewest output tokens worth calling for (fewer, when
	// the client requested fewer).
	MinOutput int64
	// Fees are what the call may cost besides its tokens, at most:
	// provider-side tools' per-use prices times their most uses.
	Fees Money
}

// Plan is what a call may do: ask for at most MaxOutput tokens per
// choice, and so cost at most Bound.
type Plan struct {
	MaxOutput int64
	// InputCost is the most the input (and the call's fees) can cost,
	// Bound the most the whole call can: InputCost + MaxOutput × Choices
	// × the output price.
	InputCost, Bound Money
}

// ErrBudgetExhausted is what a call gets when the money left cannot pay
// for even a minimal call.
var ErrBudgetExhausted = errors.New("budget exhausted")

// Shortfall says why a call was refused: it needs Need and Have is left.
type Shortfall struct {
	Need, Have Money
}

func (s *Shortfall) Error() string {
	return fmt.Sprintf("%v: a call needs at least %v, %v is left", ErrBudgetExhausted, s.Need, s.Have)
}

func (s *Shortfall) Unwrap() error { return ErrBudgetExhausted }

// PlanCall bounds a call by avail, the money left: the input at its worst
// price, and as many output tokens as the rest pays for, no more than the
// client requested or the model's maximum. It refuses (a *Shortfall) when
// what is left cannot pay for MinOutput tokens (or the client's smaller
// request). Whatever it returns, Bound <= avail.
func PlanCall(avail Money, p Price, s CallShape) (Plan, error) {
	if s.Choices < 1 || s.ModelMax < 1 || s.InputTokens < 0 || s.Requested < 0 || s.MinOutput < 1 || s.Fees < 0 {
		return Plan{}, fmt.Errorf("call shape %+v: choices, model max and min output must be at least 1, input tokens, requested and fees not negative", s)
	}
	avail = max(avail, 0)
	inCost := Money(add(mul(s.InputTokens, int64(p.WorstInput())), int64(s.Fees)))
	perToken := mul(int64(p.Output), s.Choices) // one output token in every choice
	want := s.ModelMax
	if s.Requested > 0 {
		want = min(want, s.Requested)
	}
	need := min(s.MinOutput, want)
	if inCost > avail {
		return Plan{}, &Shortfall{Need: Money(add(int64(inCost), mul(need, perToken))), Have: avail}
	}
	out := want
	if perToken > 0 {
		out = min(out, int64(avail-inCost)/perToken)
	}
	if out < need {
		return Plan{}, &Shortfall{Need: Money(add(int64(inCost), mul(need, perToken))), Have: avail}
	}
	return Plan{MaxOutput: out, InputCost: inCost, Bound: inCost + Money(out*perToken)}, nil
}

// Account is one budget: its cap, what was charged to it, and what calls
// in flight may still charge.
type Account struct {
	Cap, Spent, Reserved Money
}

// Available is what a new call may reserve.
func (a Account) Available() Money {
	return max(0, a.Cap-a.Spent-a.Reserved)
}

// Reserve holds bound for a call; it refuses what is not available.
func (a Account) Reserve(bound Money) (Account, error) {
	if bound < 0 || bound > a.Available() {
		return a, &Shortfall{Need: bound, Have: a.Available()}
	}
	a.Reserved += bound
	return a, nil
}

// Settle ends a call that reserved bound and cost actual: the account is
// charged min(actual, bound) (what the call can have cost within its
// plan) and the reservation released. Overrun is what the provider
// reported beyond the bound: recorded, never charged.
func (a Account) Settle(bound, actual Money) (next Account, charged, overrun Money) {
	charged, overrun = Charge(bound, actual)
	a.Reserved -= bound
	a.Spent += charged
	return a, charged, overrun
}

// Charge splits what a call reported, actual, into what its accounts are
// charged (never more than its bound) and the overrun.
func Charge(bound, actual Money) (charged, overrun Money) {
	actual = max(actual, 0)
	if actual > bound {
		return bound, actual - bound
	}
	return actual, 0
}
