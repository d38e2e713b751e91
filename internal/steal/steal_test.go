package steal

import (
	"runtime"
	"testing"
	"time"
)

func TestParseSteal(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"cpu  5170 12 2890 951203 311 0 95 42 0 0\ncpu0 2585 6 1445 475601 155 0 47 21 0 0\n", 420 * time.Millisecond, true},
		{"cpu  1 2 3 4 5 6 7 0 0 0", 0, true},
		{"cpu  1 2 3 4 5 6 7\n", 0, false},        // a kernel without the column
		{"cpu0 1 2 3 4 5 6 7 8 9 10\n", 0, false}, // not the machine's line
		{"cpu  1 2 3 4 5 6 7 x 9 10\n", 0, false}, // not a number
		{"", 0, false},
	} {
		got, ok := parseSteal([]byte(c.in))
		if got != c.want || ok != c.ok {
			t.Errorf("parseSteal(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestMachine(t *testing.T) {
	d, ok := Machine()
	if runtime.GOOS == "linux" && !ok {
		t.Fatal("no steal time from /proc/stat on Linux")
	}
	if d < 0 {
		t.Fatalf("steal %v", d)
	}
}
