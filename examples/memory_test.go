package examples_test

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// A bad flag value stops a program at once, before it maps or binds
// anything: status 2, nothing on stdout, one line on stderr naming the flag.
func TestExampleFlagErrors(t *testing.T) {
	for _, c := range []struct {
		prog string
		args []string
		flag string
	}{
		{"loopback", []string{"-inflight-bytes", "1x"}, "-inflight-bytes"},
		{"loopback", []string{"-inflight-bytes", "0"}, "-inflight-bytes"},
		{"consumer", []string{"-inflight-bytes", "0"}, "-inflight-bytes"},
		{"loopback", []string{"-blocks-per-item", "4", "-block-size", "67108864", "-inflight-bytes", "128MiB"}, "-inflight-bytes 256MiB or more"},
		{"loopback", []string{"-items", "100000", "-blocks-per-item", "16", "-block-size", "67108864"}, "lower -items"},
		{"loopback", []string{"-items", "0"}, "-items"},
		{"loopback", []string{"-concurrency", "-1"}, "-concurrency"},
		{"loopback", []string{"-progress-every", "-1s"}, "-progress-every"},
		{"loopback", []string{"-producers", "0"}, "-producers"},
		{"loopback", []string{"-mlock=maybe"}, "-mlock"},
		{"loopback", []string{"stray"}, `"stray"`},
		{"consumer", []string{"-blocks-per-item", "4", "-block-size", "67108864", "-inflight-bytes", "128MiB"}, "-inflight-bytes 256MiB or more"},
		{"consumer", []string{"-inflight-bytes", "lots"}, "-inflight-bytes"},
		{"consumer", []string{"-concurrency", "0"}, "-concurrency"},
		{"consumer", []string{"-data", "udp"}, "-data"},
		{"consumer", []string{"-progress-every", "-1s"}, "-progress-every"},
		{"producer", []string{"-items", "0"}, "-items"},
		{"producer", []string{"-data", "udp"}, "-data"},
		{"producer", []string{"-items", "100000", "-blocks-per-item", "16", "-block-size", "67108864"}, "lower -items"},
		{"producer", []string{"-progress-every", "-1s"}, "-progress-every"},
		{"producer", []string{"-data", "nixl", "-nixl-params", "foo"}, "-nixl-params"},
		{"producer", []string{"-data", "nixl", "-nixl-params", "=none"}, "-nixl-params"},
		{"consumer", []string{"-data", "nixl", "-nixl-params", "ucx_error_handling_mode=none,foo"}, "-nixl-params"},
		{"consumer", []string{"-data", "nixl", "-nixl-params", "a=1,a=2"}, "-nixl-params"},
	} {
		cmd := exec.Command(build(t, c.prog), c.args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		line := stderr.String()
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || stdout.Len() > 0 ||
			strings.Count(line, "\n") != 1 || !strings.Contains(line, c.flag) {
			t.Errorf("%s %v: %v\nstdout: %s\nstderr: %s", c.prog, c.args, err, stdout.String(), line)
		}
	}
}

// An item of 256 MiB, a budget that holds one: the main job keeps one in
// flight, reports how far its fill is, verifies both, and its peak RSS is
// the producer's region, the budget and little more (with -concurrency
// items in its region, it was 16 GiB).
func TestLoopbackLargeItems(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 512 MiB through a 768 MiB run")
	}
	cmd := exec.Command(build(t, "loopback"), "-items", "2", "-blocks-per-item", "4", "-block-size", "67108864",
		"-inflight-bytes", "256MiB", "-progress-every", "10ms")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("loopback: %v\n%s", err, out)
	}
	for _, re := range []string{`1 in flight \(-inflight-bytes 256MiB`, `producer: filled [\d.]+MiB of 512MiB`, `verified 2 transfers \(0 failed\)`} {
		if !regexp.MustCompile(re).Match(out) {
			t.Fatalf("no %q in:\n%s", re, out)
		}
	}
	rss := int64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) << 10
	if rss > 1<<30 {
		t.Fatalf("peak RSS %d MiB for a 512 MiB producer and a 256 MiB budget", rss>>20)
	}
	t.Logf("peak RSS %d MiB", rss>>20)
}

// The producer and consumer programs with 256 MiB items and a budget that
// holds one: the consumer keeps one in flight and verifies both.
func TestProducerConsumerLargeItems(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 512 MiB between two programs")
	}
	sizes := []string{"-items", "2", "-blocks-per-item", "4", "-block-size", "67108864"}
	out := runPrograms(t, build(t, "producer"), build(t, "consumer"), sizes, []string{"-inflight-bytes", "256MiB"}, 2)
	if !strings.Contains(string(out), "fetching 2 items of 256MiB, 1 in flight (a 256MiB region)") {
		t.Fatalf("consumer output:\n%s", out)
	}
}
