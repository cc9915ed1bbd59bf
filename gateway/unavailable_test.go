package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestCallUnavailable: a call counts as failed for the coordinator's
// reasons exactly when the provider or the gateway failed it, never when
// the caller caused the refusal.
func TestCallUnavailable(t *testing.T) {
	cases := []struct {
		name string
		call Call
		want string // "" or a part of the reason
	}{
		{"answered", Call{Status: http.StatusOK, Model: "m"}, ""},
		{"bad request", Call{Status: http.StatusBadRequest, Model: "m", Error: "the provider answered 400"}, ""},
		{"model not granted", Call{Status: http.StatusForbidden, Model: "m"}, ""},
		{"budget", Call{Status: http.StatusPaymentRequired, Refused: RefusedBudget, Model: "m"}, ""},
		{"replay past its record", Call{Status: http.StatusConflict, Refused: RefusedReplayExhausted, Model: "m"}, ""},
		{"provider 503", Call{Status: http.StatusServiceUnavailable, Model: "m", Error: "the provider answered 503"}, "model m: 503: the provider answered 503"},
		{"rate limited", Call{Status: http.StatusTooManyRequests, Model: "m", Error: "the provider answered 429"}, "429"},
		{"no answer", Call{Status: http.StatusBadGateway, Model: "m", Error: "calling the provider: connection refused"}, "connection refused"},
		{"timeout", Call{Status: http.StatusGatewayTimeout, Model: "m"}, "504 from the gateway"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.call.Unavailable()
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}
