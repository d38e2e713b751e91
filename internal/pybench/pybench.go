// Package pybench reports a Python benchmark's round trips as a Go
// benchmark's metrics, so that a Python anchor sits beside ours in one run,
// and tells the benchmarks that measure for a set time when the run only
// checks that each one works (Once).
package pybench

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Short is how long a benchmark that measures for a set time measures
// when the run takes each benchmark once (Once): long enough for a few
// round trips, fetches or engine steps, too short for a figure worth
// reading.
const Short = 250 * time.Millisecond

// Once reports whether this run takes each benchmark once, to check that
// it works, as CI does (-benchtime 1x).
func Once() bool {
	f := flag.Lookup("test.benchtime")
	return f != nil && f.Value.String() == "1x"
}

// For returns how long a benchmark measures that measures for d: d, or
// Short under Once unless the flag named (if any) was set on the command
// line.
func For(d time.Duration, flagName string) time.Duration {
	if !Once() {
		return d
	}
	set := false
	if flagName != "" {
		flag.Visit(func(f *flag.Flag) { set = set || f.Name == flagName })
	}
	if set {
		return d
	}
	return min(d, Short)
}

// Run runs python with args once (b.N is ignored: the work happens in
// Python). The script prints one JSON line, {"rtt_per_s": ..., "p50_us":
// ...}, reported as rtt/s and p50-µs, and, if it measured it, "cpu_us" (the
// CPU time of its processes per round trip) as cpu-µs/rtt; one that exits
// 3 lacks a module, and the benchmark is skipped with what it printed.
// A python that is not there skips the benchmark too, except under
// CI=true, where CI installs it.
func Run(b *testing.B, python string, args ...string) {
	b.Helper()
	for b.Loop() {
	}
	if _, err := exec.LookPath(python); err != nil {
		if os.Getenv("CI") == "true" {
			b.Fatalf("CI needs %s: %v", python, err)
		}
		b.Skipf("%s is not here: %v", python, err)
	}
	out, err := exec.Command(python, args...).Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == 3 {
		b.Skipf("%s: %s", args[0], strings.TrimSpace(string(out)))
	}
	if err != nil {
		b.Fatalf("%s: %v: %s", args[0], err, out)
	}
	var r struct {
		RTT float64 `json:"rtt_per_s"`
		P50 float64 `json:"p50_us"`
		CPU float64 `json:"cpu_us"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("%s: %s: %v", args[0], out, err)
	}
	b.ReportMetric(0, "ns/op") // the empty loop's: it would read as a figure
	b.ReportMetric(r.RTT, "rtt/s")
	b.ReportMetric(r.P50, "p50-µs")
	if r.CPU > 0 {
		b.ReportMetric(r.CPU, "cpu-µs/rtt")
	}
}

// Seconds is For(d, "") in seconds, as the scripts take it.
func Seconds(d time.Duration) string {
	return strconv.FormatFloat(For(d, "").Seconds(), 'f', -1, 64)
}
