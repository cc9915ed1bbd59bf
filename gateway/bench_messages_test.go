package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/internal/modelsim"
)

// BenchmarkMessagesOverhead measures what the gateway adds to Anthropic
// Messages calls shaped as Claude Code makes them (system blocks with
// cache_control, tools, metadata, anthropic-beta flags, cache reads and
// writes in the usage), side by side in one run on three paths:
// direct (client → scripted model server), gateway (client → the
// gateway's handler over loopback HTTP → model server) and node (client
// → a node's modelnet.Proxy → libp2p stream → gateway → model server).
//
//   - latency: small non-streaming calls, the paths interleaved call by
//     call; p50 and p99 per path and what the gateway and the whole node
//     path add (goal: ≤ 2 ms at p50);
//
//   - streams: 32 concurrent streams per path with extended thinking and
//     a tool call, each token an event of its own paced at 5 ms (200
//     tokens/s per stream, faster than the models stream), the three
//     paths' streams at once, three rounds; tokens/s per path and the
//     median ratio to direct (goal: ≥ 0.95, at most 5% lost);
//
//   - the same 32 streams unpaced (the model server as fast as it can
//     write): what the gateway's own work costs when nothing else limits.
//
//     go test -run '^$' -bench MessagesOverhead -benchtime 1x ./gateway/
func BenchmarkMessagesOverhead(b *testing.B) {
	const calls, concurrent, streamTokens = 400, 32, 300
	long := ""
	for range streamTokens {
		long += "tok "
	}
	cacheUsage := modelsim.Usage{Prompt: 300, Cached: 200, CacheWrite: 60, CacheWrite1h: 20}
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "unpaced"}, Reply: modelsim.Reply{Thinking: "First I think.", Content: long,
			ToolCalls: []modelsim.ToolCall{{ID: "toolu_1", Name: "Bash", Arguments: `{"command":"ls"}`}}, Usage: cacheUsage}},
		{When: modelsim.Cond{AnyContains: "paced"}, Reply: modelsim.Reply{Thinking: "First I think.", Content: long, TokenDelay: 5 * time.Millisecond,
			ToolCalls: []modelsim.ToolCall{{ID: "toolu_1", Name: "Bash", Arguments: `{"command":"ls"}`}}, Usage: cacheUsage}},
		{Reply: modelsim.Reply{Content: "The answer is 42.", Usage: cacheUsage}},
	}}
	n := newP2PNet(b, script)
	nodeHost, proxy, _ := n.node(b, "at-1")
	n.rig.node = nodeHost.ID()
	tok := n.grant(b, "at-1", gateway.Unlimited, func(g *gateway.Grant) {
		g.Budgets = gateway.Budgets{Attempt: gateway.Unlimited, Evaluation: gateway.Unlimited, Group: gateway.Unlimited}
	})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.gw.ServeHTTP(w, r.WithContext(modelnet.WithCaller(r.Context(), nodeHost.ID())))
	}))
	b.Cleanup(gw.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * concurrent}}
	paths := []struct{ name, url, token string }{
		{"direct", n.sim.URL(), ""},
		{"gateway", gw.URL, tok},
		{"node", proxy.URL(), tok},
	}
	body := func(text string, stream bool, thinking int) []byte {
		max := 200
		if thinking > 0 {
			max = 4000
		}
		m := claudeCodeBody("claude-sim", max, thinking, userMessages(text))
		m["stream"] = stream
		out, _ := json.Marshal(m)
		return out
	}
	small, paced, unpaced := body("What is the answer?", false, 0), body("paced", true, 1024), body("unpaced", true, 1024)
	do := func(url, token string, b0 []byte) (time.Duration, int) {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", bytes.NewReader(b0))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("anthropic-beta", claudeCodeBetas)
		req.Header.Set("x-api-key", token)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Error(err)
			return 0, 0
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if err != nil || resp.StatusCode != 200 {
			b.Errorf("%s: %d %v %s", url, resp.StatusCode, err, out)
		}
		return took, bytes.Count(out, []byte(`"text_delta"`))
	}
	// concurrentRate runs concurrent streams on one path and returns
	// its total tokens per second.
	concurrentRate := func(url, token string, b0 []byte) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		var mu sync.Mutex
		total := 0
		for range concurrent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, k := do(url, token, b0)
				mu.Lock()
				total += k
				mu.Unlock()
			}()
		}
		wg.Wait()
		if total < concurrent*streamTokens {
			b.Errorf("%s: %d text deltas of %d", url, total, concurrent*streamTokens)
		}
		return float64(total) / time.Since(start).Seconds()
	}
	for range b.N {
		lat := make([][]time.Duration, len(paths))
		for i := range calls + 20 {
			for k, p := range paths {
				d, _ := do(p.url, p.token, small)
				if i >= 20 {
					lat[k] = append(lat[k], d)
				}
			}
		}
		p50 := make([]time.Duration, len(paths))
		p99 := make([]time.Duration, len(paths))
		for k := range paths {
			slices.Sort(lat[k])
			p50[k], p99[k] = lat[k][len(lat[k])/2], lat[k][len(lat[k])*99/100]
		}
		// Paced: the three paths' 32 streams at once (96 streams), so that
		// whatever else the machine runs slows them alike; three rounds,
		// the median ratio kept. Unpaced: path by path (each as fast as
		// the CPU allows), twice alternating, the better kept.
		pacedRate := make([]float64, len(paths))
		var pacedRatio [2][]float64
		for range 3 {
			var wg sync.WaitGroup
			rates := make([]float64, len(paths))
			for k, p := range paths {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rates[k] = concurrentRate(p.url, p.token, paced)
				}()
			}
			wg.Wait()
			for k := range paths {
				pacedRate[k] += rates[k] / 3
			}
			pacedRatio[0] = append(pacedRatio[0], rates[1]/rates[0])
			pacedRatio[1] = append(pacedRatio[1], rates[2]/rates[0])
		}
		slices.Sort(pacedRatio[0])
		slices.Sort(pacedRatio[1])
		unpacedRate := make([]float64, len(paths))
		for range 2 {
			for k, p := range paths {
				unpacedRate[k] = max(unpacedRate[k], concurrentRate(p.url, p.token, unpaced))
			}
		}
		for k := range paths {
			b.Logf("%-8s p50 %7.3f ms  p99 %7.3f ms  32 paced streams %8.0f tokens/s  32 unpaced %8.0f tokens/s",
				paths[k].name, ms(p50[k]), ms(p99[k]), pacedRate[k], unpacedRate[k])
		}
		b.Logf("added at p50: gateway %.3f ms, node path %.3f ms; at p99: gateway %.3f ms, node path %.3f ms",
			ms(p50[1]-p50[0]), ms(p50[2]-p50[0]), ms(p99[1]-p99[0]), ms(p99[2]-p99[0]))
		b.ReportMetric(ms(p50[0]), "direct_p50_ms")
		b.ReportMetric(ms(p50[1]-p50[0]), "gw_added_p50_ms")
		b.ReportMetric(ms(p50[2]-p50[0]), "node_added_p50_ms")
		b.ReportMetric(ms(p99[2]-p99[0]), "node_added_p99_ms")
		b.ReportMetric(pacedRatio[0][1], "gw_paced32_ratio")
		b.ReportMetric(pacedRatio[1][1], "node_paced32_ratio")
		b.ReportMetric(unpacedRate[1]/unpacedRate[0], "gw_unpaced32_ratio")
		b.ReportMetric(unpacedRate[2]/unpacedRate[0], "node_unpaced32_ratio")
	}
}
