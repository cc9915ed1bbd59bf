package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/internal/modelsim"
)

// BenchmarkGatewayOverhead measures what the gateway adds to a model call,
// side by side in one run, the paths interleaved call by call:
//
//   - direct: the client calls the scripted model server;
//   - gateway: the client calls the gateway's handler over loopback HTTP
//     (authorization, budget plan and settlement, rewrite, recording in
//     memory), which calls the model server;
//   - node: the client calls a node's proxy, which forwards over a libp2p
//     stream (TLS, yamux, loopback TCP) to the gateway: the whole path an
//     agent's call takes.
//
// It reports p50 and p99 latency of a small non-streaming call on each
// path, the added p50 and p99 (goal: node - direct <= 2 ms at p50), and
// streaming throughput (tokens/s of a 2,000-token stream) with the
// ratios to direct. The gateway records in memory, or (recorder=file)
// with FileRecorder, which syncs every body and record to disk before the
// answer is given.
//
//	go test -run '^$' -bench GatewayOverhead -benchtime 1x ./gateway/
func BenchmarkGatewayOverhead(b *testing.B) {
	for _, rec := range []string{"memory", "file"} {
		b.Run("recorder="+rec, func(b *testing.B) { benchOverhead(b, rec == "file") })
	}
}

func benchOverhead(b *testing.B, fileRecorder bool) {
	const calls, streams, streamTokens = 400, 12, 2000
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "stream please"}, Reply: modelsim.Reply{Content: strings.Repeat("tok ", streamTokens), Usage: modelsim.Usage{Prompt: 50}}},
		{Reply: modelsim.Reply{Content: "The answer is 42.", Usage: modelsim.Usage{Prompt: 50}}},
	}}
	n := newP2PNet(b, script)
	if fileRecorder {
		rec, err := gateway.OpenFileRecorder(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		gw, err := gateway.New(testConfig(n.sim.URL()), n.tokens, n.ledger, rec)
		if err != nil {
			b.Fatal(err)
		}
		*n.gw = *gw
	}
	nodeHost, proxy, _ := n.node(b, "at-1")
	n.rig.node = nodeHost.ID()
	tok := n.grant(b, "at-1", gateway.Unlimited, func(g *gateway.Grant) {
		g.Budgets = gateway.Budgets{Attempt: gateway.Unlimited, Evaluation: gateway.Unlimited, Group: gateway.Unlimited}
	})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.gw.ServeHTTP(w, r.WithContext(modelnet.WithCaller(r.Context(), nodeHost.ID())))
	}))
	b.Cleanup(gw.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	paths := []struct {
		name, url, path, token string
	}{
		{"direct", n.sim.URL() + "/v1", "/chat/completions", ""},
		{"gateway", gw.URL + "/v1", "/chat/completions", tok},
		{"node", proxy.URL() + "/v1", "/chat/completions", tok},
	}
	small, _ := json.Marshal(map[string]any{"model": "gpt-sim", "messages": []any{map[string]any{"role": "user", "content": "What is the answer?"}}})
	big, _ := json.Marshal(map[string]any{"model": "gpt-sim", "stream": true, "messages": []any{map[string]any{"role": "user", "content": "stream please"}}})
	do := func(url, token string, body []byte) (time.Duration, int) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("%s: %d %v %s", url, resp.StatusCode, err, out)
		}
		return took, bytes.Count(out, []byte(`"content":"`))
	}
	for range b.N {
		lat := make([][]time.Duration, len(paths))
		for i := range calls + 20 {
			for k, p := range paths {
				d, _ := do(p.url+p.path, p.token, small)
				if i >= 20 { // warm-up
					lat[k] = append(lat[k], d)
				}
			}
		}
		rate := make([]float64, len(paths))
		for range streams {
			for k, p := range paths {
				d, chunks := do(p.url+p.path, p.token, big)
				if chunks < streamTokens {
					b.Fatalf("%s streamed %d chunks", p.name, chunks)
				}
				rate[k] += float64(streamTokens) / d.Seconds() / streams
			}
		}
		p50 := make([]time.Duration, len(paths))
		p99 := make([]time.Duration, len(paths))
		for k := range paths {
			slices.Sort(lat[k])
			p50[k], p99[k] = lat[k][len(lat[k])/2], lat[k][len(lat[k])*99/100]
			b.Logf("%-8s p50 %7.3f ms  p99 %7.3f ms  stream %8.0f tokens/s", paths[k].name, ms(p50[k]), ms(p99[k]), rate[k])
		}
		b.Logf("added at p50: gateway %.3f ms, node path %.3f ms; at p99: gateway %.3f ms, node path %.3f ms",
			ms(p50[1]-p50[0]), ms(p50[2]-p50[0]), ms(p99[1]-p99[0]), ms(p99[2]-p99[0]))
		b.ReportMetric(ms(p50[0]), "direct_p50_ms")
		b.ReportMetric(ms(p50[2]-p50[0]), "added_p50_ms")
		b.ReportMetric(ms(p99[2]-p99[0]), "added_p99_ms")
		b.ReportMetric(ms(p50[1]-p50[0]), "gw_added_p50_ms")
		b.ReportMetric(float64(p50[2])/float64(p50[0]), "p50_ratio")
		b.ReportMetric(rate[0], "direct_tok/s")
		b.ReportMetric(rate[2], "node_tok/s")
		b.ReportMetric(rate[2]/rate[0], "stream_ratio")
		b.ReportMetric(rate[1]/rate[0], "gw_stream_ratio")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkGeminiOverhead measures what the gateway adds to a Gemini call,
// side by side in one run against the scripted server's Gemini API, the
// paths interleaved: direct (client → model server), gateway (client →
// the gateway's handler over loopback HTTP → model server) and node
// (client → a node's proxy → libp2p → gateway → model server).
//
// It reports p50 and p99 latency of a small generateContent call on each
// path and what the gateway and the node path add (goal: <= 2 ms at p50),
// and the throughput of 32 concurrent streamGenerateContent?alt=sse
// streams on each path, one path at a time (each first in turn): paced
// as a fast model streams (a token every 5 ms, 200 tokens/s per stream,
// 6,400 in all; goal: <= 5% loss), and unpaced (tokens as fast as the
// server writes them: what the CPU allows, and the process's CPU time
// per token on each path, whose differences are what the gateway and the
// node hop cost per token whatever the machine's other load).
//
//	go test -run '^$' -bench GeminiOverhead -benchtime 1x ./gateway/
func BenchmarkGeminiOverhead(b *testing.B) {
	const calls, concurrent, pacedTokens, fastTokens = 400, 32, 400, 1000
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "paced stream"}, Reply: modelsim.Reply{Content: strings.Repeat("tok ", pacedTokens),
			TokenDelay: 5 * time.Millisecond, Usage: modelsim.Usage{Prompt: 50, Thoughts: 10}}},
		{When: modelsim.Cond{AnyContains: "fast stream"}, Reply: modelsim.Reply{Content: strings.Repeat("tok ", fastTokens), Usage: modelsim.Usage{Prompt: 50}}},
		{Reply: modelsim.Reply{Content: "The answer is 42.", Usage: modelsim.Usage{Prompt: 50, Cached: 20, Thoughts: 5}}},
	}}
	n := newGeminiP2PNet(b, script)
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
	paths := []struct {
		name, base, model string
	}{
		{"direct", n.sim.URL(), "gemini-sim-2026"},
		{"gateway", gw.URL, "gemini-sim"},
		{"node", proxy.URL(), "gemini-sim"},
	}
	body := func(text string) []byte {
		out, _ := json.Marshal(map[string]any{"contents": []any{map[string]any{"role": "user", "parts": []any{map[string]any{"text": text}}}}})
		return out
	}
	small, paced, fast := body("What is the answer?"), body("paced stream please"), body("fast stream please")
	do := func(url string, token string, body []byte) (time.Duration, int) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("x-goog-api-key", token)
		}
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
		return took, bytes.Count(out, []byte(`"text":"`))
	}
	token := func(k int) string {
		if k == 0 {
			return ""
		}
		return tok
	}
	// streams runs concurrent streams on path k and returns the tokens
	// per second they moved together.
	streams := func(k int, body []byte, tokens int) float64 {
		p := paths[k]
		url := p.base + "/v1beta/models/" + p.model + ":streamGenerateContent?alt=sse"
		var wg sync.WaitGroup
		start := time.Now()
		var moved atomic.Int64
		for range concurrent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, chunks := do(url, token(k), body)
				if chunks < tokens {
					b.Errorf("%s streamed %d chunks of %d", p.name, chunks, tokens)
				}
				moved.Add(int64(min(chunks, tokens)))
			}()
		}
		wg.Wait()
		return float64(moved.Load()) / time.Since(start).Seconds()
	}
	for range b.N {
		lat := make([][]time.Duration, len(paths))
		for i := range calls + 20 {
			for k, p := range paths {
				d, _ := do(p.base+"/v1beta/models/"+p.model+":generateContent", token(k), small)
				if i >= 20 { // warm-up
					lat[k] = append(lat[k], d)
				}
			}
		}
		const rounds = 3
		pacedRate := make([]float64, len(paths))
		fastRate := make([]float64, len(paths))
		for i := range rounds {
			for j := range paths {
				k := (i + j) % len(paths) // each path first in turn
				pacedRate[k] += streams(k, paced, pacedTokens) / rounds
			}
		}
		cpu := make([]time.Duration, len(paths)) // process CPU per unpaced token
		for range rounds {
			for k := range paths {
				before := processCPU()
				fastRate[k] += streams(k, fast, fastTokens) / rounds
				cpu[k] += (processCPU() - before) / (rounds * concurrent * fastTokens)
			}
		}
		if b.Failed() {
			return
		}
		p50 := make([]time.Duration, len(paths))
		p99 := make([]time.Duration, len(paths))
		for k := range paths {
			slices.Sort(lat[k])
			p50[k], p99[k] = lat[k][len(lat[k])/2], lat[k][len(lat[k])*99/100]
			b.Logf("%-8s p50 %7.3f ms  p99 %7.3f ms  %d paced streams %8.0f tokens/s  unpaced %8.0f tokens/s, %5.1f µs CPU per token", paths[k].name, ms(p50[k]), ms(p99[k]),
				concurrent, pacedRate[k], fastRate[k], float64(cpu[k])/float64(time.Microsecond))
		}
		b.Logf("added at p50: gateway %.3f ms, node path %.3f ms; at p99: gateway %.3f ms, node path %.3f ms; paced throughput ratio gateway %.3f node %.3f; unpaced gateway %.3f node %.3f",
			ms(p50[1]-p50[0]), ms(p50[2]-p50[0]), ms(p99[1]-p99[0]), ms(p99[2]-p99[0]),
			pacedRate[1]/pacedRate[0], pacedRate[2]/pacedRate[0], fastRate[1]/fastRate[0], fastRate[2]/fastRate[0])
		b.ReportMetric(ms(p50[0]), "direct_p50_ms")
		b.ReportMetric(ms(p50[1]-p50[0]), "gw_added_p50_ms")
		b.ReportMetric(ms(p50[2]-p50[0]), "added_p50_ms")
		b.ReportMetric(ms(p99[2]-p99[0]), "added_p99_ms")
		b.ReportMetric(pacedRate[1]/pacedRate[0], "gw_paced_ratio")
		b.ReportMetric(pacedRate[2]/pacedRate[0], "paced_ratio")
		b.ReportMetric(fastRate[2]/fastRate[0], "unpaced_ratio")
		b.ReportMetric(float64(cpu[1]-cpu[0])/float64(time.Microsecond), "gw_cpu_us/token")
		b.ReportMetric(float64(cpu[2]-cpu[0])/float64(time.Microsecond), "node_cpu_us/token")
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkResponsesOverhead measures what the gateway adds to an
// OpenAI Responses API call (POST /v1/responses), side by side in one
// run against the scripted model server, on the three paths of
// BenchmarkGatewayOverhead (direct, gateway, node; memory recorder):
//
//   - p50 and p99 latency of a small non-streaming call, the paths
//     interleaved call by call (goal: gateway - direct <= 2 ms at p50);
//
//   - throughput of 32 concurrent streams, each of 200 tokens paced at
//     5 ms a token (200 tokens/s a stream, as fast as fast models
//     stream), the paths taking turns round by round in a rotating
//     order; the loss is the median over rounds of each round's rate
//     against the direct rate of the same round (goal: at most 5%);
//
//   - the same with 32 unpaced streams of 2,000 tokens: the CPU-bound
//     worst case, where every event costs the gateway a parse and a
//     write on the machine the model server and the client share.
//
//     go test -run '^$' -bench ResponsesOverhead -benchtime 1x ./gateway/
func BenchmarkResponsesOverhead(b *testing.B) {
	const calls, streams, pacedRounds, fastRounds, pacedTokens, fastTokens = 400, 32, 9, 3, 200, 2000
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "paced stream"}, Reply: modelsim.Reply{Content: strings.Repeat("tok ", pacedTokens),
			TokenDelay: 5 * time.Millisecond, Usage: modelsim.Usage{Prompt: 50}}},
		{When: modelsim.Cond{AnyContains: "fast stream"}, Reply: modelsim.Reply{Content: strings.Repeat("tok ", fastTokens), Usage: modelsim.Usage{Prompt: 50}}},
		{Reply: modelsim.Reply{Content: "The answer is 42.", Usage: modelsim.Usage{Prompt: 50, Cached: 20}}},
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
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * streams}}
	paths := []struct{ name, url, token string }{
		{"direct", n.sim.URL() + "/v1/responses", ""},
		{"gateway", gw.URL + "/v1/responses", tok},
		{"node", proxy.URL() + "/v1/responses", tok},
	}
	body := func(text string, stream bool) []byte {
		b, _ := json.Marshal(map[string]any{"model": "gpt-sim", "instructions": "Be brief.", "store": false, "stream": stream,
			"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}}})
		return b
	}
	small, paced, fast := body("What is the answer?", false), body("paced stream", true), body("fast stream", true)
	do := func(url, token string, body []byte) (time.Duration, int, error) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, 0, err
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if err != nil || resp.StatusCode != 200 {
			return 0, 0, fmt.Errorf("%s: %d %v %.300s", url, resp.StatusCode, err, out)
		}
		return took, bytes.Count(out, []byte(`"type":"response.output_text.delta"`)), nil
	}
	// concurrent runs streams calls of body at once on path k and returns
	// the tokens per second they got together.
	concurrent := func(k int, body []byte, tokens int) float64 {
		errs := make(chan error, streams)
		start := time.Now()
		for range streams {
			go func() {
				_, got, err := do(paths[k].url, paths[k].token, body)
				if err == nil && got < tokens {
					err = fmt.Errorf("%s streamed %d of %d tokens", paths[k].name, got, tokens)
				}
				errs <- err
			}()
		}
		for range streams {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		return float64(streams*tokens) / time.Since(start).Seconds()
	}
	// rates runs rounds of concurrent streams on every path, the order
	// rotating, and returns each path's median rate and median loss
	// against direct in the same round (percent).
	rates := func(rounds int, body []byte, tokens int) (rate, loss []float64) {
		per := make([][]float64, len(paths))
		losses := make([][]float64, len(paths))
		for r := range rounds {
			got := make([]float64, len(paths))
			for i := range paths {
				k := (i + r) % len(paths)
				got[k] = concurrent(k, body, tokens)
			}
			for k := range paths {
				per[k] = append(per[k], got[k])
				losses[k] = append(losses[k], 100*(1-got[k]/got[0]))
			}
		}
		for k := range paths {
			rate, loss = append(rate, median(per[k])), append(loss, median(losses[k]))
		}
		return rate, loss
	}
	for range b.N {
		lat := make([][]time.Duration, len(paths))
		for i := range calls + 20 {
			for k, p := range paths {
				d, _, err := do(p.url, p.token, small)
				if err != nil {
					b.Fatal(err)
				}
				if i >= 20 { // warm-up
					lat[k] = append(lat[k], d)
				}
			}
		}
		pacedRate, pacedLoss := rates(pacedRounds, paced, pacedTokens)
		fastRate, fastLoss := rates(fastRounds, fast, fastTokens)
		p50 := make([]time.Duration, len(paths))
		p99 := make([]time.Duration, len(paths))
		for k := range paths {
			slices.Sort(lat[k])
			p50[k], p99[k] = lat[k][len(lat[k])/2], lat[k][len(lat[k])*99/100]
			b.Logf("%-8s p50 %7.3f ms  p99 %7.3f ms  32 paced streams %7.0f tokens/s (loss %5.1f%%)  32 unpaced %7.0f tokens/s (loss %5.1f%%)",
				paths[k].name, ms(p50[k]), ms(p99[k]), pacedRate[k], pacedLoss[k], fastRate[k], fastLoss[k])
		}
		b.Logf("added at p50: gateway %.3f ms, node path %.3f ms; at p99: gateway %.3f ms, node path %.3f ms",
			ms(p50[1]-p50[0]), ms(p50[2]-p50[0]), ms(p99[1]-p99[0]), ms(p99[2]-p99[0]))
		b.ReportMetric(ms(p50[0]), "direct_p50_ms")
		b.ReportMetric(ms(p50[1]-p50[0]), "gw_added_p50_ms")
		b.ReportMetric(ms(p50[2]-p50[0]), "node_added_p50_ms")
		b.ReportMetric(pacedLoss[1], "gw_paced_loss_%")
		b.ReportMetric(pacedLoss[2], "node_paced_loss_%")
		b.ReportMetric(fastLoss[1], "gw_unpaced_loss_%")
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
