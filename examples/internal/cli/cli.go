// Package cli holds the flag and memory helpers the producer and consumer
// examples share: size and NIXL-parameter flags, flag checks that name the
// flag, and the check that a run fits the machine's memory.
package cli

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Size is a flag of bytes: a Positive number, or one with K, M, G or T
// (powers of 1024: 256M, 1GiB).
type Size int64

func (s Size) String() string { return FormatSize(int64(s)) }

func (s *Size) Set(v string) error {
	t := strings.TrimSpace(v)
	digits := strings.TrimRightFunc(t, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(t[len(digits):])), "B"), "I")
	shift, ok := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[unit]
	n, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil || n > math.MaxInt64>>shift {
		return errors.New("want bytes, or with K, M, G or T: 256M, 1GiB")
	}
	if n == 0 {
		return errors.New("want a Positive Size: 256M, 1GiB")
	}
	*s = Size(n << shift)
	return nil
}

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

// FormatSize writes n exactly when it is a whole number of its unit
// ("64MiB"), else to a tenth ("1.5GiB").
func FormatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	u := 0
	for u+1 < len(units) && n >= 1<<(10*(u+1)) {
		u++
	}
	if n%(1<<(10*u)) == 0 {
		return strconv.FormatInt(n>>(10*u), 10) + units[u]
	}
	return strconv.FormatFloat(float64(n)/float64(int64(1)<<(10*u)), 'f', 1, 64) + units[u]
}

// ItemBytes is the Size of one item, or -1 if it overflows.
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
			return fmt.Errorf("-%s %d: want a Positive number", names[i], v)
		}
	}
	return nil
}

// CheckMemory fails, before anything is mapped, a region larger than the
// memory this machine has available (MemAvailable of /proc/meminfo; no
// check where it is unknown). what names the flags that set it.
func CheckMemory(need int64, what string) error {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err == nil && (need < 0 || need > kb<<10) {
			return fmt.Errorf("the region needs %s but this machine has %s available: lower %s", FormatSize(need), FormatSize(kb<<10), what)
		}
		break
	}
	return nil
}

// ParseFlags parses the command line and exits on a bad flag: status 2
// with one line naming it (the Usage only for -h).
func ParseFlags(name string) {
	fs := flag.CommandLine
	fs.Init(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	err := fs.Parse(os.Args[1:])
	fs.SetOutput(os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	case fs.NArg() > 0:
		fmt.Fprintf(os.Stderr, "%s: %q is not a flag (flags start with -)\n", name, fs.Arg(0))
	default:
		return
	}
	os.Exit(2)
}

// Usage exits with status 2 and one line, for a flag with a bad value.
func Usage(name string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	os.Exit(2)
}
