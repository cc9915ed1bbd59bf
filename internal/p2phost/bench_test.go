package p2phost

import (
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"
)

// BenchmarkSecureConn sends 1 GiB over TLS on loopback TCP, in writes the
// size of a yamux frame, from stock libp2p TLS and from ours, alternately
// in the same run (CPU is both ends', one process). It reports each one's
// rate and CPU seconds per GiB, and the ratios ours / stock.
//
//	go test -run '^$' -bench SecureConn -benchtime 1x ./internal/p2phost/
func BenchmarkSecureConn(b *testing.B) {
	const total = 1 << 30
	for _, frame := range []int{64 << 10, maxFrame} {
		b.Run(fmt.Sprintf("frame=%dKiB", frame>>10), func(b *testing.B) {
			for range b.N {
				stockRate, stockCPU := sendOver(b, false, frame, total)
				oursRate, oursCPU := sendOver(b, true, frame, total)
				b.Logf("%d KiB writes: stock %.0f MiB/s, %.2f CPU s/GiB; ours %.0f MiB/s, %.2f CPU s/GiB",
					frame>>10, stockRate, stockCPU, oursRate, oursCPU)
				b.ReportMetric(oursRate, "MiB/s")
				b.ReportMetric(oursCPU, "cpu_s/GiB")
				b.ReportMetric(stockRate, "stock_MiB/s")
				b.ReportMetric(stockCPU, "stock_cpu_s/GiB")
				b.ReportMetric(oursRate/stockRate, "rate_ratio")
				b.ReportMetric(oursCPU/stockCPU, "cpu_ratio")
			}
		})
	}
}

func sendOver(b *testing.B, corked bool, frame, total int) (mibps, cpuPerGiB float64) {
	cl, srv, _ := securePair(b, corked)
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, srv, int64(total))
		done <- err
	}()
	buf := make([]byte, frame)
	t0, c0 := time.Now(), cpuTime()
	for n := 0; n < total; n += frame {
		if _, err := cl.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	el, cpu := time.Since(t0), cpuTime()-c0
	gib := float64(total) / (1 << 30)
	return gib * 1024 / el.Seconds(), cpu.Seconds() / gib
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
