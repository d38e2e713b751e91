// Package steal reads how much CPU time the hypervisor took from this
// machine: what a latency tail on a shared VM comes with.
package steal

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// Machine is the CPU time the hypervisor gave to others while this
// machine's CPUs wanted to run (the steal column of /proc/stat's first
// line, all CPUs, in USER_HZ ticks of 10 ms); false where there is no
// such file (not Linux, or no /proc).
func Machine() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	return parseSteal(b)
}

// parseSteal reads the steal column of the contents of /proc/stat.
func parseSteal(b []byte) (time.Duration, bool) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, false
	}
	ticks, err := strconv.ParseInt(string(f[8]), 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ticks) * 10 * time.Millisecond, true
}
