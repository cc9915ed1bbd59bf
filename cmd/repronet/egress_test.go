package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/repronet/repronet/coordinator"
)

// TestAttemptEgress: `repronet attempt egress` prints the record the API
// serves as a table, and as it is with --json.
func TestAttemptEgress(t *testing.T) {
	view := coordinator.EgressView{Attempt: "ah-1", Omitted: 2, Refused: 3, Hosts: []coordinator.EgressHostView{
		{Host: "pypi.org", Connections: 4, BytesSent: 1200, BytesReceived: 1 << 20}, {Host: "answers.example", Refused: 2}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/attempts/ah-1/egress" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, `{"error": "no"}`, http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(view)
	}))
	defer srv.Close()
	t.Setenv("REPRONET_API", srv.URL)
	t.Setenv("REPRONET_TOKEN", "tok")
	out, err := cli(t, "attempt", "egress", "ah-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HOST", "pypi.org", "1048576", "answers.example", "2 more hosts left out by the node", "3 refusals in all"} {
		if !strings.Contains(out, want) {
			t.Errorf("%q not in\n%s", want, out)
		}
	}
	out, err = cli(t, "attempt", "egress", "ah-1", "--json")
	var got coordinator.EgressView
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || len(got.Hosts) != 2 || got.Hosts[1].Refused != 2 {
		t.Fatalf("--json: %v %s", err, out)
	}
	if _, err := cli(t, "attempt", "egress", "ah-2"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("an unknown attempt: %v", err)
	}
}
