package ptimer

import (
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// within bounds a wait that must end: generous, since a loaded CI machine
// may be slow; precision is BenchmarkLateness's business.
const within = 10 * time.Second

func TestFires(t *testing.T) {
	tm := New()
	defer tm.Close()
	for _, d := range []time.Duration{0, time.Microsecond, 200 * time.Microsecond, 2 * time.Millisecond} {
		start := time.Now()
		tm.Reset(d)
		select {
		case <-tm.C:
			if got := time.Since(start); got < d {
				t.Fatalf("Reset(%v) fired after %v", d, got)
			}
		case <-time.After(within):
			t.Fatalf("Reset(%v) never fired", d)
		}
	}
}

func TestResetReplaces(t *testing.T) {
	tm := New()
	defer tm.Close()
	tm.Reset(time.Hour)
	tm.Reset(time.Millisecond)
	select {
	case <-tm.C:
	case <-time.After(within):
		t.Fatal("the second arming never fired")
	}
}

func TestStopDisarms(t *testing.T) {
	tm := New()
	defer tm.Close()
	tm.Reset(time.Hour)
	tm.Stop()
	if armed(t, tm) {
		t.Fatal("armed after Stop")
	}
	tm.Reset(time.Hour)
	if !armed(t, tm) {
		t.Fatal("not armed after Reset")
	}
	// A tick that came before Stop does not outlive it.
	tm.fire()
	tm.Stop()
	select {
	case <-tm.C:
		t.Fatal("a tick survived Stop")
	default:
	}
}

func TestCloseEndsGoroutine(t *testing.T) {
	tm := New()
	tm.Reset(time.Hour)
	if err := tm.Close(); err != nil {
		t.Fatal(err)
	}
	// goleak in TestMain checks that the reader is gone.
}

// BenchmarkLateness reports how late a 50 µs wait ends, at the median and
// the 99th percentile, for this timer and for Go's.
//
//	go test -run '^$' -bench Lateness ./internal/ptimer
func BenchmarkLateness(b *testing.B) {
	const d = 50 * time.Microsecond
	report := func(b *testing.B, late []time.Duration) {
		slices.Sort(late)
		b.ReportMetric(float64(late[len(late)/2].Microseconds()), "late-p50-µs")
		b.ReportMetric(float64(late[len(late)*99/100].Microseconds()), "late-p99-µs")
	}
	measure := func(b *testing.B, reset func(time.Duration), c <-chan time.Time) {
		late := make([]time.Duration, 0, b.N)
		for b.Loop() {
			s := time.Now()
			reset(d)
			<-c
			late = append(late, time.Since(s)-d)
		}
		report(b, late)
	}
	b.Run("ptimer", func(b *testing.B) {
		tm := New()
		defer tm.Close()
		measure(b, tm.Reset, tm.C)
	})
	b.Run("go-timer", func(b *testing.B) {
		tm := time.NewTimer(time.Hour)
		defer tm.Stop()
		measure(b, func(d time.Duration) { tm.Reset(d) }, tm.C)
	})
}
