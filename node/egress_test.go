package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox/egress"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// TestExecuteEgressRecord runs a proxy-mode job in the real sandbox that
// fetches a file from an allowed host twice and tries a host off its list:
// the signed report carries the egress record (hosts, requests, bytes,
// the refusal), and it passes proto.ValidateReport.
func TestExecuteEgressRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	runner, _ := realSandbox(t, ctx, log)
	const payload = "the data set, 41 bytes of it, no more.\n.\n"
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, payload) })}
	go srv.Serve(ln)
	defer srv.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	local := []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	n, coords := newTestNode(t, 1, func(c *Config) {
		c.Sandbox, c.Logger = runner, log
		c.Egress = egress.Config{Resolver: mapResolver{"files.test": local, "answers.test": local},
			Permit: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, Ports: []uint16{port}}
	})
	image := addToStore(t, ctx, n, busyboxImage(t, nil, ociimage.Config{Env: []string{"PATH=/bin"}}))
	script := fmt.Sprintf(`wget -q -O /workspace/a http://files.test:%[1]d/data && wget -q -O /workspace/b http://files.test:%[1]d/data
wget -q -O /workspace/c http://answers.test:%[1]d/gold || echo refused
cat /workspace/a > /workspace/report.json`, port)
	a := assignment(t, "exec-egress")
	r := a.Recipe
	r.ImageCid = image.Bytes()
	r.Inputs, r.Edits, r.Env = nil, nil, nil
	r.EntrypointSet, r.Entrypoint, r.Args = true, nil, []string{"sh", "-c", script}
	r.Limits.Network, r.Limits.Allow = "proxy", []string{"files.test"}
	r.Limits.Pids, r.Limits.OutputBytes = 256, 64<<10
	p, code, reason := n.plan(r)
	if code != proto.DeclineCode_DECLINE_UNSPECIFIED {
		t.Fatalf("plan: %s %s", code, reason)
	}
	var ph phase
	res, err := n.execute(ctx, coords[0], a, p, &ph, log)
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	rep := &proto.Report{AttemptId: "exec-egress", StartedUnixMillis: time.Now().UnixMilli() - 1000, FinishedUnixMillis: time.Now().UnixMilli()}
	fillReport(rep, res)
	if rep.GetOutcome() != proto.Outcome_OUTCOME_OK || !strings.Contains(string(rep.GetStdoutTail()), "refused") {
		t.Fatalf("outcome %s (%s); stdout %s; stderr %s", rep.GetOutcome(), rep.GetDetail(), rep.GetStdoutTail(), rep.GetStderrTail())
	}
	if err := proto.ValidateReport(rep); err != nil {
		t.Fatalf("the report with its egress record: %v", err)
	}
	by := map[string]*proto.EgressHost{}
	for _, h := range rep.GetEgress() {
		by[h.GetHost()] = h
	}
	if len(by) != 2 {
		t.Fatalf("egress record %v, want files.test and answers.test", rep.GetEgress())
	}
	if f := by["files.test"]; f.GetConnections() != 2 || f.GetBytesReceived() != 2*uint64(len(payload)) || f.GetRefused() != 0 {
		t.Errorf("files.test: %v, want 2 requests and %d bytes received", f, 2*len(payload))
	}
	if g := by["answers.test"]; g.GetRefused() != 1 || g.GetConnections() != 0 {
		t.Errorf("answers.test: %v, want 1 refused", g)
	}
	if rep.GetUsage().GetEgressRefused() != 1 {
		t.Errorf("usage.egress_refused %d, want 1", rep.GetUsage().GetEgressRefused())
	}
	if _, left := n.egress.TakeRecord(localRunID(coords[0], "exec-egress")); left {
		t.Error("the proxy still keeps the attempt's record after the report took it")
	}
}
