package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestApplyConfig: a configuration file sets the flags the command line
// left unset (a list sets a repeatable flag once per element), the
// command line wins, tables are handed back, and a key that is no flag,
// or a list for a flag of one value, is an error naming the key.
func TestApplyConfig(t *testing.T) {
	cases := []struct {
		name, file string
		args       []string
		want       string // the flags after, as "data|slots|listen|verbose"
		tables     int
		err        string
	}{
		{name: "flags from the file", file: "data = \"/srv/x\"\nslots = 4\nlisten = [\"/a\", \"/b\"]\nverbose = true\n",
			want: "/srv/x|4|[/a /b]|true"},
		{name: "the command line wins", file: "data = \"/srv/x\"\nslots = 4\n", args: []string{"--slots", "2"},
			want: "/srv/x|2|[]|false"},
		{name: "tables handed back", file: "data = \"/d\"\n[[providers]]\nname = \"p\"\n[[models]]\nname = \"m\"\n",
			want: "/d|1|[]|false", tables: 2},
		{name: "unknown key", file: "data = \"/d\"\nslot = 3\n", err: `"slot" is not a setting of repronet test`},
		{name: "list for one value", file: "slots = [1, 2]\n", err: "slots: a list is given, but --slots takes one value"},
		{name: "a table that is no flag", file: "[node]\nslots = 1\n", err: `"node" is not a setting`},
		{name: "not TOML", file: "data = \n", err: "--config"},
		{name: "config names itself", file: "config = \"other.toml\"\n", err: `"config" is not a setting`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.toml")
			if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			fs.String(configFlag, "", "")
			data := fs.String("data", "", "")
			slots := fs.Int("slots", 1, "")
			verbose := fs.Bool("verbose", false, "")
			var listen stringList
			fs.Var(&listen, "listen", "")
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			tables, err := applyConfig(fs, path, gatewayTables...)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, want an error with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join([]string{*data, strconv.Itoa(*slots), listen.String(), strconv.FormatBool(*verbose)}, "|")
			if got != c.want || len(tables) != c.tables {
				t.Fatalf("got %s with %d tables, want %s with %d", got, len(tables), c.want, c.tables)
			}
		})
	}
}

// TestCoordinatorConfigFile starts `repronet coordinator --config FILE` as
// a user does, with the model gateway's providers in the file and the
// provider's key in the environment: an evaluation naming a model no
// provider serves is refused with the API's 400 naming it, one naming a
// served model is queued; a coordinator without providers refuses every
// model; the key is in no log line.
func TestCoordinatorConfigFile(t *testing.T) {
	const key = "sk-config-test-key-0123456789"
	t.Setenv("REPRONET_TEST_PROVIDER_KEY", key)
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.token")
	os.WriteFile(admin, []byte(cliAdmin+"\n"), 0o600)
	withModels := `
listen = ["/ip4/127.0.0.1/tcp/0"]
http = "127.0.0.1:0"
admin-token-file = "ADMIN"
sample = true

[[providers]]
name = "lab-vllm"
api = "openai"
base_url = "http://127.0.0.1:9/v1"
key_env = "REPRONET_TEST_PROVIDER_KEY"

[[models]]
name = "served-model"
provider = "lab-vllm"
max_output = 4096
price = { input = 3, output = 15, cached_input = 0.3, cache_write = 3.75 }
`
	api, log := startConfigured(t, dir, "with.toml", strings.Replace(withModels, "ADMIN", admin, 1))
	t.Setenv("REPRONET_API", api)
	t.Setenv("REPRONET_TOKEN", cliAdmin)
	_, err := cli(t, "eval", "start", "--suite", "corebench-sample", "--agent", "oracle", "--levels", "easy", "--models", "gpt-4o")
	if err == nil || !strings.Contains(err.Error(), "models gpt-4o: no provider of this coordinator serves them (it serves served-model") {
		t.Fatalf("an evaluation naming an unserved model: %v", err)
	}
	if out, err := cli(t, "eval", "start", "--suite", "corebench-sample", "--agent", "oracle", "--levels", "easy", "--models", "served-model"); err != nil ||
		!strings.Contains(out, "attempts queued") {
		t.Fatalf("an evaluation naming a served model: %s %v", out, err)
	}
	if strings.Contains(log(), key) || !strings.Contains(log(), "model gateway serving") {
		t.Fatalf("the coordinator's log has the key, or no gateway:\n%s", log())
	}

	bare := "listen = [\"/ip4/127.0.0.1/tcp/0\"]\nhttp = \"127.0.0.1:0\"\nadmin-token-file = \"" + admin + "\"\nsample = true\n"
	api, _ = startConfigured(t, t.TempDir(), "bare.toml", bare)
	t.Setenv("REPRONET_API", api)
	_, err = cli(t, "eval", "start", "--suite", "corebench-sample", "--agent", "oracle", "--levels", "easy", "--models", "gpt-4o")
	if err == nil || !strings.Contains(err.Error(), "has no model access") {
		t.Fatalf("an evaluation naming a model on a coordinator without providers: %v", err)
	}
}

// startConfigured writes name in dir and runs the coordinator with
// --config on it (and its data in dir); it returns the API's URL and the
// log so far.
func startConfigured(t *testing.T, dir, name, text string) (string, func() string) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	pr, pw := io.Pipe()
	var (
		mu   sync.Mutex
		logb strings.Builder
	)
	logText := func() string { mu.Lock(); defer mu.Unlock(); return logb.String() }
	lines := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg="HTTP API listening" addr=(\S+)`)
		buf := make([]byte, 64<<10)
		for {
			n, err := pr.Read(buf)
			mu.Lock()
			logb.Write(buf[:n])
			mu.Unlock()
			if m := re.FindStringSubmatch(logText()); m != nil {
				select {
				case lines <- m[1]:
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		done <- runCoordinator(ctx, []string{"--config", path, "--data", filepath.Join(dir, "data")}, io.Discard, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	select {
	case addr := <-lines:
		return "http://" + addr, logText
	case err := <-done:
		t.Fatalf("the coordinator stopped: %v\n%s", err, logText())
	case <-ctx.Done():
		t.Fatalf("the coordinator did not start:\n%s", logText())
	}
	return "", nil
}
