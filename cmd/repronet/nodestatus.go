package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/repronet/repronet/node"
)

// runNodeStatus prints a running node's status, read from its --metrics
// address (GET /status).
func runNodeStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("node status", "node status [--metrics ADDR] [--json]", stderr)
	addr := fs.String("metrics", "127.0.0.1:9101", "the node's --metrics address")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	base := *addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/status", nil)
	if err != nil {
		return fmt.Errorf("--metrics %q: %w", *addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("node at %s: %w (is it running with --metrics %s?)", *addr, err, *addr)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node at %s: GET /status: %s", *addr, resp.Status)
	}
	var st node.Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&st); err != nil {
		return fmt.Errorf("node at %s: %w", *addr, err)
	}
	if *asJSON {
		return printJSON(stdout, st)
	}
	writeNodeStatus(stdout, st)
	return nil
}

// writeNodeStatus prints a node's status for its volunteer.
func writeNodeStatus(w io.Writer, st node.Status) {
	mib := func(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
	fmt.Fprintf(w, "node %s\n", st.Peer)
	fmt.Fprintf(w, "slots: %d free of %d; outbox: %d report(s)", st.FreeSlots, st.TotalSlots, st.Outbox)
	if st.Draining {
		fmt.Fprint(w, "; draining: no new work (repronet node resume to take work again)")
	}
	if st.Unsaved > 0 {
		fmt.Fprintf(w, " (%d held in memory: the data folder is full)", st.Unsaved)
	}
	fmt.Fprintf(w, "\ncredit: %.4f CPU-hours, %.4f wall-clock hours over %d accepted report(s)\n", st.Credit.CPUHours,
		st.Credit.WallSeconds/3600, st.Credit.Reports)
	fmt.Fprintf(w, "egress refused since start: %d request(s) or connection(s)\n", st.EgressRefused)
	fmt.Fprintf(w, "capsule cache: %s used", mib(float64(st.Cache.UsedBytes)))
	if st.Cache.QuotaBytes > 0 {
		fmt.Fprintf(w, " of %s", mib(float64(st.Cache.QuotaBytes)))
	}
	fmt.Fprintf(w, ", %d capsule(s); data disk: %s free of %s", st.Cache.Capsules, mib(float64(st.Disk.FreeBytes)), mib(float64(st.Disk.TotalBytes)))
	if st.Disk.Full {
		fmt.Fprint(w, " (below its reserve: work is declined)")
	}
	fmt.Fprintln(w)
	for _, c := range st.Coordinators {
		state := "not connected"
		if c.Connected {
			state = "connected"
		}
		fmt.Fprintf(w, "coordinator %s: %s\n", c.Peer, state)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tSUITE\tGROUP\tPHASE\tELAPSED\tWALL LIMIT\tCPU\tMEMORY\tNETWORK")
	for _, r := range st.Running {
		network := r.Network
		if len(r.Allow) > 0 {
			network += fmt.Sprintf(" (%d allowed)", len(r.Allow))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%ds\t%dm\t%s\t%s\n", r.Attempt, r.Suite, r.Group, r.Phase,
			(time.Duration(r.Elapsed) * time.Second).String(), r.WallSeconds, r.CPUMillis, mib(float64(r.MemoryBytes)), network)
	}
	if len(st.Running) == 0 {
		fmt.Fprintln(tw, "(nothing running)")
	}
	tw.Flush()
	if len(st.Finished) > 0 {
		var parts []string
		for o, n := range st.Finished {
			parts = append(parts, fmt.Sprintf("%s %d", o, n))
		}
		slices.Sort(parts)
		fmt.Fprintf(w, "finished since start: %s\n", strings.Join(parts, ", "))
	}
}
