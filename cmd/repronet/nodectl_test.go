package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/families"
)

// TestNodeJoin: `repronet node join URL TOKEN` against a coordinator on
// loopback admits the node's operator and writes its configuration,
// keeping what else the file held; a wrong token writes nothing.
func TestNodeJoin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := coordinator.New(ctx, coordinator.Config{DataDir: t.TempDir(), Network: "join-test-net", JoinTokens: []string{"right-token-0123456789"},
		Families: families.Registry(), Checker: families.Checker(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	web := httptest.NewServer(c.Handler())
	defer web.Close()

	dir := t.TempDir()
	config := filepath.Join(dir, "etc", "node.toml")
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		t.Fatal(err)
	}
	opPath := filepath.Join(dir, "operator.key")
	opKey, err := loadOrCreateKey(opPath)
	if err != nil {
		t.Fatal(err)
	}
	opID, _ := peer.IDFromPrivateKey(opKey)
	kept := "# my settings\nslots = 3\ncoordinator = [\"/ip4/10.0.0.1/tcp/1/p2p/old\"]\noperator-key = \"" + opPath + "\"\n"
	if err := os.WriteFile(config, []byte(kept), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	join := func(token string) (string, error) {
		var out bytes.Buffer
		err := runNodeJoin(ctx, []string{web.URL, token, "--config", config, "--data", data, "--restart", "no"}, &out, io.Discard)
		return out.String(), err
	}
	if _, err := join("short"); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("a token the node would refuse to read: %v", err)
	}
	if _, err := join("wrong-token-0123456789"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a wrong token: %v", err)
	}
	if b, _ := os.ReadFile(config); string(b) != kept {
		t.Fatalf("a refused join changed the configuration:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "etc", "join.token")); err == nil {
		t.Fatal("a refused join wrote the token")
	}
	out, err := join("right-token-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "admitted") {
		t.Fatalf("output: %s", out)
	}
	b, _ := os.ReadFile(config)
	conf := string(b)
	want := `coordinator = ["/ip4/127.0.0.1/tcp/`
	if !strings.Contains(conf, want) || !strings.Contains(conf, "/p2p/"+c.ID().String()+`"]`) || strings.Contains(conf, "10.0.0.1") ||
		!strings.Contains(conf, `network = "join-test-net"`) || !strings.Contains(conf, "slots = 3") || !strings.Contains(conf, "# my settings") ||
		!strings.Contains(conf, `join-token-file = "`+filepath.Join(dir, "etc", "join.token")+`"`) || !strings.Contains(conf, `data = "`+data+`"`) {
		t.Fatalf("configuration written:\n%s", conf)
	}
	st, err := os.Stat(filepath.Join(dir, "etc", "join.token"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", st, err)
	}
	// The operator admitted is the one the configuration's operator key
	// names (the node announces certificates of that key).
	ops := c.Operators()
	if len(ops) != 1 || ops[0].Operator != opID.String() || !strings.Contains(out, "operator "+opID.String()) {
		t.Fatalf("admitted %+v, want %s; output %s", ops, opID, out)
	}
	// The file reads as a configuration (--config): the list, the strings.
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	var coords stringList
	fs.Var(&coords, "coordinator", "")
	netName, tokenFile, dataDir, slots := fs.String("network", "", ""), fs.String("join-token-file", "", ""), fs.String("data", "", ""), fs.Int("slots", 1, "")
	fs.String("operator-key", "", "")
	if _, err := applyConfig(fs, config); err != nil {
		t.Fatal(err)
	}
	if len(coords) != 1 || !strings.HasSuffix(coords[0], c.ID().String()) || *netName != "join-test-net" || *slots != 3 ||
		*tokenFile != filepath.Join(dir, "etc", "join.token") || *dataDir != data {
		t.Fatalf("read back: %v %q %q %q %d", coords, *netName, *tokenFile, *dataDir, *slots)
	}
	// Joining again replaces the keys instead of repeating them.
	if _, err := join("right-token-0123456789"); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(config)
	if k := strings.Count(string(b), "\ncoordinator ="); k != 1 {
		t.Fatalf("%d coordinator lines after a second join:\n%s", k, b)
	}
}

func TestJoinAddr(t *testing.T) {
	const id = "12D3KooWEU5g9F3chwpEgBZ5ZMX6iWmApjdFEfH6GyC2u6HTtR7Q"
	cases := []struct {
		host, body, want, network, err string
	}{
		{"coord.example.org", `{"network":"n1","peer":"` + id + `","addrs":["/ip4/10.0.0.5/udp/4001/quic-v1/p2p/` + id + `","/ip4/10.0.0.5/tcp/4001/p2p/` + id + `"]}`,
			"/dns/coord.example.org/tcp/4001/p2p/" + id, "n1", ""},
		{"203.0.113.5", `{"peer":"` + id + `","addrs":["/ip4/127.0.0.1/tcp/4002"]}`, "/ip4/203.0.113.5/tcp/4002/p2p/" + id, "", ""},
		{"2001:db8::1", `{"peer":"` + id + `","addrs":["/ip6/::1/tcp/4003"]}`, "/ip6/2001:db8::1/tcp/4003/p2p/" + id, "", ""},
		{"h", `{"nodes":3}`, "", "", "peer ID"},
		{"h", `{"peer":"` + id + `","addrs":["/ip4/1.2.3.4/udp/1/quic-v1","nonsense"]}`, "", "", "no TCP address"},
		{"h", `{"peer":"not-a-peer","addrs":["/ip4/1.2.3.4/tcp/1"]}`, "", "", "h"},
		{"h", `not json`, "", "", "/api/network"},
	}
	for _, tc := range cases {
		addr, network, err := joinAddr(tc.host, []byte(tc.body))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s %s: %q, %v; want an error saying %q", tc.host, tc.body, addr, err, tc.err)
			}
			continue
		}
		if err != nil || addr != tc.want || network != tc.network {
			t.Errorf("%s %s: %q %q %v; want %q %q", tc.host, tc.body, addr, network, err, tc.want, tc.network)
		}
	}
}

// FuzzJoinAddr: whatever a coordinator answers, joinAddr returns an error
// or a multiaddr a node can dial (one with the peer ID), never a panic.
func FuzzJoinAddr(f *testing.F) {
	const id = "12D3KooWEU5g9F3chwpEgBZ5ZMX6iWmApjdFEfH6GyC2u6HTtR7Q"
	f.Add("coord.example.org", `{"network":"n1","peer":"`+id+`","addrs":["/ip4/10.0.0.5/tcp/4001/p2p/`+id+`"]}`)
	f.Add("10.0.0.1", `{"peer":"`+id+`","addrs":["/ip6/::1/tcp/1"]}`)
	f.Add("x/y", `{"peer":"`+id+`","addrs":["/ip4/1.2.3.4/tcp/1"]}`)
	f.Add("", `{"peer":"/p2p/x","addrs":[""]}`)
	f.Fuzz(func(t *testing.T, host, body string) {
		addr, _, err := joinAddr(host, []byte(body))
		if err != nil {
			return
		}
		if _, err := peer.AddrInfoFromString(addr); err != nil {
			t.Fatalf("joinAddr(%q, %q) = %q, which does not parse: %v", host, body, addr, err)
		}
	})
}

// TestPackagedConfigs: the configuration files the packages install hold
// only settings the commands know. The node's names no coordinator until
// it joins; the coordinator's runs (its paths and ports moved aside by
// flags, which win).
func TestPackagedConfigs(t *testing.T) {
	err := runNode(context.Background(), []string{"--config", "../../dist/node.toml"}, io.Discard, io.Discard)
	if !errors.Is(err, errNoCoordinator) {
		t.Fatalf("repronet node --config dist/node.toml: %v, want only %v", err, errNoCoordinator)
	}
	b, err := os.ReadFile("../../dist/coordinator.toml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	text := strings.NewReplacer("/var/lib/repronet/coordinator", dir, "/ip4/0.0.0.0/tcp/4001", "/ip4/127.0.0.1/tcp/0",
		"127.0.0.1:8080", "127.0.0.1:0").Replace(string(b))
	for _, k := range []string{"data", "network", "listen", "http", "admin-token-file", "join-token-file"} {
		if !strings.Contains(text, "\n"+k+" = ") {
			t.Fatalf("dist/coordinator.toml sets no %s", k)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(cliAdmin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	api, log := startConfigured(t, dir, "coordinator.toml", text)
	if !strings.Contains(log(), "HTTP API listening") || api == "" {
		t.Fatalf("log:\n%s", log())
	}
	if _, err := os.Stat(filepath.Join(dir, "join.token")); err != nil {
		t.Fatalf("the standing join token was not made: %v", err)
	}
}
