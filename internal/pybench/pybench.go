// Package pybench reports a Python benchmark's round trips as a Go
// benchmark's metrics, so that a Python anchor sits beside ours in one run.
package pybench

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// Run runs python with args once (b.N is ignored: the work happens in
// Python). The script prints one JSON line, {"rtt_per_s": ..., "p50_us":
// ...}, reported as rtt/s and p50-µs, and, if it measured it, "cpu_us" (the
// CPU time of its processes per round trip) as cpu-µs/rtt; one that exits
// 3 lacks a module, and the benchmark is skipped with what it printed.
func Run(b *testing.B, python string, args ...string) {
	b.Helper()
	for b.Loop() {
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
