// Command mkdeb makes repronet's Debian packages (package dist): make dist.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/repronet/repronet/dist"
)

func main() {
	root := flag.String("root", ".", "source tree")
	out := flag.String("out", "bin/dist", "output folder")
	version := flag.String("version", "", "package version (default: the binary's)")
	arch := flag.String("arch", "", "Go architecture (default: this machine's)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		os.Exit(1)
	}
	made, err := dist.Build(ctx, dist.Options{Root: *root, Out: *out, Version: *version, Arch: *arch})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		os.Exit(1)
	}
	for _, p := range made {
		fmt.Println(p)
	}
}
