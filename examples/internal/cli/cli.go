// Package cli holds the flag and memory helpers the producer and consumer
// examples share, on top of the loopback's (internal/demo): size and
// NIXL-parameter flags, flag checks that name the flag, and the check
// that a run fits the machine's memory.
package cli

import (
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/ecxfer/ecxfer/internal/demo"
)

// Size is a flag of bytes: a positive number, or one with K, M, G or T
// (powers of 1024: 256M, 1GiB).
type Size = demo.Bytes

// FormatSize writes n exactly when it is a whole number of its unit
// ("64MiB"), else to a tenth ("1.5GiB").
func FormatSize(n int64) string { return demo.FormatBytes(n) }

// Params is a flag of NIXL backend parameters, key=value[,key=value]: an
// entry without '=', with an empty key or a key given twice is refused, so
// a typo fails the start rather than leaving a backend default in place.
type Params map[string]string

func (p Params) String() string {
	kvs := make([]string, 0, len(p))
	for k, v := range p {
		kvs = append(kvs, k+"="+v)
	}
	slices.Sort(kvs)
	return strings.Join(kvs, ",")
}

func (p *Params) Set(s string) error {
	m := Params{}
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not key=value", kv)
		}
		if _, dup := m[k]; dup {
			return fmt.Errorf("%q given twice", k)
		}
		m[k] = v
	}
	*p = m
	return nil
}

// ItemBytes is the size of one item, or -1 if it overflows.
func ItemBytes(perItem, blockSize int) int64 {
	if perItem <= 0 || blockSize <= 0 || int64(blockSize) > math.MaxInt64/int64(perItem) {
		return -1
	}
	return int64(perItem) * int64(blockSize)
}

// Positive checks that each named flag is above zero.
func Positive(names []string, values ...int) error {
	for i, v := range values {
		if v <= 0 {
			return fmt.Errorf("-%s %d: want a positive number", names[i], v)
		}
	}
	return nil
}

// CheckMemory fails, before anything is mapped, a region larger than the
// memory this machine has available (MemAvailable of /proc/meminfo; no
// check where it is unknown). what names the flags that set it.
func CheckMemory(need int64, what string) error {
	if avail, ok := demo.MemAvailable(); ok && (need < 0 || need > avail) {
		return fmt.Errorf("the region needs %s but this machine has %s available: lower %s", FormatSize(need), FormatSize(avail), what)
	}
	return nil
}

// ParseFlags parses the command line and exits on a bad flag: status 2
// with one line naming it (the usage only for -h).
func ParseFlags(name string) { demo.ParseFlags(name, flag.CommandLine, os.Args[1:]) }

// Usage exits with status 2 and one line, for a flag with a bad value.
func Usage(name string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	os.Exit(2)
}
