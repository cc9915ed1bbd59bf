package proto

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestValidateReport(t *testing.T) {
	ok := func() *Report {
		return &Report{AttemptId: "at-1", Outcome: Outcome_OUTCOME_OK, StartedUnixMillis: 1_700_000_000_000,
			FinishedUnixMillis: 1_700_000_001_000, Usage: &Usage{CpuSeconds: 0.5, WallMillis: 900}}
	}
	tests := []struct {
		name string
		edit func(*Report)
		want string // "" for valid, else a substring of the error
	}{
		{"valid", func(*Report) {}, ""},
		{"no usage at all", func(r *Report) { r.Usage = nil }, ""},
		{"NaN cpu", func(r *Report) { r.Usage.CpuSeconds = math.NaN() }, "usage.cpu_seconds"},
		{"+Inf cpu", func(r *Report) { r.Usage.CpuSeconds = math.Inf(1) }, "usage.cpu_seconds"},
		{"negative cpu", func(r *Report) { r.Usage.CpuSeconds = -0.1 }, "usage.cpu_seconds"},
		{"huge cpu", func(r *Report) { r.Usage.CpuSeconds = 1e300 }, "usage.cpu_seconds"},
		{"negative wall", func(r *Report) { r.Usage.WallMillis = -1 }, "usage.wall_millis"},
		{"no start", func(r *Report) { r.StartedUnixMillis = 0 }, "started_unix_millis"},
		{"finish before start", func(r *Report) { r.FinishedUnixMillis = r.StartedUnixMillis - 1 }, "before started"},
		{"finish in the far future", func(r *Report) { r.FinishedUnixMillis = math.MaxInt64 }, "after 2100"},
		{"unknown outcome", func(r *Report) { r.Outcome = 99 }, "outcome 99"},
		{"bad attempt id", func(r *Report) { r.AttemptId = "../x" }, "attempt_id"},
		{"huge detail", func(r *Report) { r.Detail = strings.Repeat("d", MaxReportText+1) }, "detail"},
		{"too many outputs", func(r *Report) { r.Outputs = make([]*OutputRef, MaxReportOutputs+1) }, "outputs"},
		{"output without path", func(r *Report) { r.Outputs = []*OutputRef{{}} }, "outputs[0].path"},
		{"output without a cid or an error", func(r *Report) { r.Outputs = []*OutputRef{{Path: "report.json"}} }, "outputs[0].cid"},
		{"output with an error", func(r *Report) { r.Outputs = []*OutputRef{{Path: "report.json", Error: "missing"}} }, ""},
		{"a chain head", func(r *Report) { r.ModelChainHead = strings.Repeat("ab", 32) }, ""},
		{"a chain head that is not one", func(r *Report) { r.ModelChainHead = "deadbeef" }, "model_chain_head"},
		{"an egress record", func(r *Report) {
			r.Egress = []*EgressHost{{Host: "pypi.org", Connections: 3, BytesSent: 900, BytesReceived: 1 << 20},
				{Host: "evil.example", Refused: 2}, {Host: "(invalid)", Refused: 1}, {Host: "gone.example", Failed: 2}}
			r.EgressHostsOmitted = 4
		}, ""},
		{"too many egress hosts", func(r *Report) {
			for i := range MaxReportEgressHosts + 1 {
				r.Egress = append(r.Egress, &EgressHost{Host: fmt.Sprintf("h%d.example", i), Connections: 1})
			}
		}, "egress hosts"},
		{"an egress host without a name", func(r *Report) { r.Egress = []*EgressHost{{Connections: 1}} }, "egress[0].host"},
		{"an egress host too long", func(r *Report) {
			r.Egress = []*EgressHost{{Host: strings.Repeat("a", MaxEgressHost+1), Connections: 1}}
		}, "egress[0].host"},
		{"an egress host with a control byte", func(r *Report) { r.Egress = []*EgressHost{{Host: "a\x1b[2Jb", Connections: 1}} }, "printable"},
		{"an egress host with a space", func(r *Report) { r.Egress = []*EgressHost{{Host: "a b", Connections: 1}} }, "printable"},
		{"an egress host with UTF-8", func(r *Report) { r.Egress = []*EgressHost{{Host: "bücher.example", Connections: 1}} }, "printable"},
		{"an egress host twice", func(r *Report) {
			r.Egress = []*EgressHost{{Host: "pypi.org", Connections: 1}, {Host: "pypi.org", Refused: 1}}
		}, "twice"},
		{"an egress host with nothing", func(r *Report) { r.Egress = []*EgressHost{{Host: "pypi.org"}} }, "neither"},
		{"an egress count past the bound", func(r *Report) {
			r.Egress = []*EgressHost{{Host: "pypi.org", Connections: math.MaxUint64}}
		}, "connections"},
		{"egress bytes past the bound", func(r *Report) {
			r.Egress = []*EgressHost{{Host: "pypi.org", Connections: 1, BytesReceived: math.MaxUint64}}
		}, "bytes"},
		{"egress omitted past the bound", func(r *Report) { r.EgressHostsOmitted = math.MaxUint32 }, "egress_hosts_omitted"},
	}
	for _, tt := range tests {
		r := ok()
		tt.edit(r)
		err := ValidateReport(r)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: error %v, want one naming %q", tt.name, err, tt.want)
		}
	}
}
