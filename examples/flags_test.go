package examples_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Every example refuses a bad flag at once: exit status 2 and one line on
// stderr naming the flag, before it maps, fills or serves anything.
func TestBadFlags(t *testing.T) {
	sizes := [][]string{ // name, then a bad value
		{"items", "0"}, {"items", "-1"}, {"blocks-per-item", "0"}, {"blocks-per-item", "-3"},
		{"block-size", "0"}, {"block-size", "-4096"}, {"progress-every", "-1s"}, {"mlock", "maybe"},
		{"data", "udp"},
	}
	common := [][]string{{"no-such-flag", ""}, {"items", "many"}}
	type bad struct {
		flag string
		args []string
	}
	cases := map[string][]bad{}
	add := func(prog, flag string, args ...string) { cases[prog] = append(cases[prog], bad{flag, args}) }
	for _, prog := range []string{"producer", "consumer", "loopback", "probe"} {
		for _, s := range append(sizes, common...) {
			if s[1] == "" {
				add(prog, s[0], "-"+s[0])
			} else {
				add(prog, s[0], "-"+s[0]+"="+s[1])
			}
		}
		add(prog, "nixl-params", "-nixl-params", "foo") // not key=value
		add(prog, "nixl-params", "-nixl-params", "=1")  // no key
		add(prog, "stray", "-items", "10", "stray")     // not a flag
	}
	for _, prog := range []string{"producer", "consumer"} {
		add(prog, "nixl-params", "-nixl-params", "a=1,a=2") // a key twice
	}
	for _, a := range []string{"foo", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:port", "tcp://", "http://127.0.0.1:5555"} {
		add("producer", "control", "-control", a)
		add("producer", "data-addr", "-data-addr", a)
		add("consumer", "producer", "-producer", a)
		add("probe", "producer", "-producer", a)
		if a != "tcp://" { // the rest is empty: no metrics
			add("loopback", "metrics", "-metrics", a)
		}
	}
	for _, a := range []string{"ipc://", "ipc://@"} { // no path
		add("producer", "control", "-control", a)
		add("consumer", "producer", "-producer", a)
		add("probe", "producer", "-producer", a)
	}
	for _, a := range []string{"tcp://127.0.0.1:0", ":5555"} { // no peer to dial
		add("consumer", "producer", "-producer", a)
		add("probe", "producer", "-producer", a)
	}
	add("consumer", "concurrency", "-concurrency", "0")
	add("consumer", "deadline", "-deadline", "0")
	add("consumer", "inflight-bytes", "-inflight-bytes", "0")
	add("consumer", "inflight-bytes", "-inflight-bytes", "-1M")
	add("loopback", "concurrency", "-concurrency", "-1")
	add("loopback", "inflight-bytes", "-inflight-bytes", "1Q")
	add("loopback", "producers", "-producers", "0")
	add("loopback", "consumers", "-consumers", "-1")
	add("loopback", "duration", "-duration", "-1s")
	add("loopback", "fetches", "-fetches", "-1")
	add("loopback", "rate", "-rate", "-1")
	add("loopback", "nixl-post", "-nixl-post", "later")
	add("loopback", "nixl-progress", "-nixl-progress", "nobody")
	add("loopback", "role", "-role", "both")
	add("loopback", "producer-list", "-producer-list", "127.0.0.1:1")
	add("loopback", "producer-list", "-role", "consumer")
	add("probe", "timeout", "-timeout", "0")
	add("probe", "timeout", "-timeout", "-1s")
	add("probe", "blocks", "-blocks", "0")
	add("probe", "compat-of", "-compat-of", "a,b")
	add("probe", "fetch", "-fetch", "demo:x")

	for prog, bads := range cases {
		bin := build(t, prog)
		t.Run(prog, func(t *testing.T) {
			for _, b := range bads {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				cmd := exec.CommandContext(ctx, bin, b.args...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				err := cmd.Run()
				cancel()
				var exit *exec.ExitError
				line := strings.TrimSuffix(stderr.String(), "\n")
				switch {
				case errors.Is(ctx.Err(), context.DeadlineExceeded):
					t.Errorf("%s %q: still running after 30 s: the flag was taken", prog, b.args)
				case !errors.As(err, &exit) || exit.ExitCode() != 2:
					t.Errorf("%s %q: %v, want exit status 2\n%s", prog, b.args, err, stderr.Bytes())
				case strings.Contains(line, "\n") || !strings.HasPrefix(line, prog+": ") || !strings.Contains(line, b.flag):
					t.Errorf("%s %q: stderr is not one line naming %s:\n%s", prog, b.args, b.flag, stderr.Bytes())
				}
			}
		})
	}
}
