package demo

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// DefaultInflightBytes is a consumer's default budget of bytes in flight
// (-inflight-bytes): one 1 GiB item, or as many smaller ones as
// -concurrency allows. The consumer's region is this big at most.
const DefaultInflightBytes = 1 << 30

// Bytes is a size flag: a positive number of bytes, or one with K, M, G
// or T (powers of 1024, "256M", "1GiB").
type Bytes int64

// String implements flag.Value.
func (b Bytes) String() string { return FormatBytes(int64(b)) }

// Set implements flag.Value.
func (b *Bytes) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("want a positive size: 256M, 1GiB")
	}
	*b = Bytes(n)
	return nil
}

// ParseBytes reads a size: digits with an optional unit, K, M, G or T
// (powers of 1024; "KiB", "KB" and "B" are read alike).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	digits := strings.TrimRightFunc(t, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.ToUpper(strings.TrimSpace(t[len(digits):]))
	unit = strings.TrimSuffix(strings.TrimSuffix(unit, "B"), "I")
	shift, ok := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[unit]
	n, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, errors.New("want bytes, or with K, M, G or T: 256M, 1GiB")
	}
	return n << shift, nil
}

// FormatBytes writes n the way ParseBytes reads it: exactly when it is a
// whole number of its unit ("64MiB"), else to a tenth ("1.5GiB").
func FormatBytes(n int64) string {
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

// ItemBytes is the size of one item, or -1 if it overflows.
func (c Config) ItemBytes() int64 {
	if c.BlocksPerItem <= 0 || c.BlockSize <= 0 || int64(c.BlockSize) > math.MaxInt64/int64(c.BlocksPerItem) {
		return -1
	}
	return int64(c.BlocksPerItem) * int64(c.BlockSize)
}

// InFlight is how many fetches a consumer keeps in flight: as many items
// as InflightBytes holds, at most Concurrency and Items (an item is
// fetched once at a time). Its region holds that many items.
func (c Config) InFlight() (int, error) {
	item := c.ItemBytes()
	budget := int64(c.InflightBytes)
	if budget == 0 {
		budget = DefaultInflightBytes
	}
	if item < 0 || item > budget {
		return 0, fmt.Errorf("-inflight-bytes %s holds no item of %d blocks of %s: give -inflight-bytes %s or more, or a smaller -block-size or -blocks-per-item",
			FormatBytes(budget), c.BlocksPerItem, FormatBytes(int64(c.BlockSize)), FormatBytes(item))
	}
	return int(min(budget/item, int64(c.Concurrency), int64(c.Items))), nil
}

// Memory is what a run of producers and consumers of cfg maps: each
// producer's region holds every item, each consumer's InFlight items. It
// saturates at math.MaxInt64.
func (c Config) Memory(producers, consumers int) (prod, cons int64) {
	n, _ := c.InFlight()
	mul := func(a, b int64) int64 {
		if a < 0 || b < 0 || (a > 0 && b > math.MaxInt64/a) {
			return math.MaxInt64
		}
		return a * b
	}
	item := c.ItemBytes()
	return mul(int64(producers), mul(int64(c.Items), item)), mul(int64(consumers), mul(int64(n), item))
}

// CheckMemory fails a run that maps more than the machine has available
// (MemAvailable of /proc/meminfo; no check where it is unknown), before
// anything is mapped or filled.
func (c Config) CheckMemory(producers, consumers int) error {
	avail, ok := MemAvailable()
	if !ok {
		return nil
	}
	prod, cons := c.Memory(producers, consumers)
	need := prod + cons
	if need < prod { // overflow
		need = math.MaxInt64
	}
	if need <= avail {
		return nil
	}
	return fmt.Errorf("the run needs %s (producers' regions %s for -items %d, consumers' %s for -inflight-bytes) but this machine has %s available: lower -items, -inflight-bytes, -blocks-per-item or -block-size",
		FormatBytes(need), FormatBytes(prod), c.Items, FormatBytes(cons), FormatBytes(avail))
}

// MemAvailable is the memory the kernel estimates can be had without
// swapping (MemAvailable in /proc/meminfo), or false where unknown.
func MemAvailable() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// ParseFlags parses args into fs and exits on a bad one: status 2 with one
// line naming the flag (the usage only for -h).
func ParseFlags(name string, fs *flag.FlagSet, args []string) {
	out := fs.Output()
	fs.Init(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	case fs.NArg() > 0:
		fmt.Fprintf(os.Stderr, "%s: %q is not a flag (flags start with -)\n", name, fs.Arg(0))
		os.Exit(2)
	}
}
