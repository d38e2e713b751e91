// Package cli holds the flag and memory helpers the examples share, on
// top of the loopback's (internal/demo): size and NIXL-parameter flags,
// flag checks that name the flag (addresses among them), and the check
// that a run fits the machine's memory.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
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

// Endpoint checks the control-plane address of flag name: tcp://host:port,
// host:port or ipc://path (a Unix-domain socket; ipc://@name is Linux's
// abstract namespace). A listener's may leave the host out (every
// interface) and take port 0 (any free one); a peer's names both. The host
// is not looked up, nor the path: that is the start's to fail.
func Endpoint(name, addr string, listen bool) error {
	const want = "tcp://host:port, host:port or ipc://path"
	if path, ok := strings.CutPrefix(addr, "ipc://"); ok {
		if path == "" || path == "@" {
			return fmt.Errorf("-%s %q: want %s (no path)", name, addr, want)
		}
		return nil
	}
	return hostPort(name, strings.TrimPrefix(addr, "tcp://"), listen, want)
}

// HostPort checks the host:port address of flag name, as Endpoint does
// (no tcp:// prefix).
func HostPort(name, addr string, listen bool) error {
	return hostPort(name, addr, listen, "host:port")
}

func hostPort(name, addr string, listen bool, want string) error {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		n, perr := strconv.ParseUint(port, 10, 16)
		switch {
		case perr != nil:
			err = fmt.Errorf("port %q is not a number from 0 to 65535", port)
		case !listen && n == 0:
			err = fmt.Errorf("port 0 names no peer")
		case !listen && host == "":
			err = fmt.Errorf("no host")
		case strings.Contains(host, "/"):
			err = fmt.Errorf("host %q", host)
		}
	}
	if ae, ok := err.(*net.AddrError); ok {
		err = errors.New(ae.Err) // without the address again
	}
	if err != nil {
		return fmt.Errorf("-%s %q: want %s (%v)", name, addr, want, err)
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
