package gateway

import (
	"context"
	"errors"
	"time"
)

// An agent may call models from several conversations at once (a main
// loop, sub-agents, side calls). Each call holds its bound on its budgets
// until it settles, and gives back what it did not spend; so a call can
// find its budget short only because calls in flight hold the money.
// reserve waits for them rather than refusing: a call is refused for its
// budget only when what is spent leaves too little, or when calls still
// hold the money at the end of the wait (the call's timeout).

// Polling bounds of reserve's wait.
const (
	reserveFirstWait = 5 * time.Millisecond
	reserveMaxWait   = 200 * time.Millisecond
)

// reserve is Ledger.Reserve, waiting while calls in flight hold what the
// call needs.
func (g *Gateway) reserve(ctx context.Context, accounts []AccountRef, plan func(Money) (Plan, error)) (Reservation, Plan, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(g.limits.CallTimeout))
	defer cancel()
	wait := reserveFirstWait
	for {
		res, p, err := g.ledger.Reserve(ctx, accounts, plan)
		if err == nil || !heldInFlight(err) {
			return res, p, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, p, err
		case <-t.C:
		}
		wait = min(2*wait, reserveMaxWait)
	}
}

// heldInFlight says whether a budget refusal is only for money that calls
// in flight hold: with it given back the call could be made.
func heldInFlight(err error) bool {
	var be *BudgetError
	var sf *Shortfall
	if !errors.As(err, &be) || !errors.As(err, &sf) || be.State.Reserved <= 0 {
		return false
	}
	return add(int64(sf.Have), int64(be.State.Reserved)) >= int64(sf.Need)
}
