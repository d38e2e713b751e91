package wake

import (
	"sync/atomic"
	"testing"
	"time"
)

// kinds runs f on the timerfd waiter and on the fallback.
func kinds(t *testing.T, f func(t *testing.T, w *Waiter)) {
	t.Run("default", func(t *testing.T) {
		w := New()
		defer w.Close()
		f(t, w)
	})
	t.Run("fallback", func(t *testing.T) {
		w := &Waiter{}
		w.initFallback()
		defer w.Close()
		f(t, w)
	})
}

// within fails the test if f has not returned after a generous watchdog:
// the failure these tests look for is a Wait that never returns.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting after 10 s", what)
	}
}

func TestWakeBeforeWait(t *testing.T) {
	kinds(t, func(t *testing.T, w *Waiter) {
		w.Wake()
		w.Wake() // coalesced
		within(t, "Wait(-1) after Wake", func() { w.Wait(-1) })
		// Both wakes were used up: the next Wait runs to its timeout.
		start := time.Now()
		w.Wait(20 * time.Millisecond)
		if el := time.Since(start); el < 20*time.Millisecond {
			t.Fatalf("Wait(20ms) returned after %v: a wake was left over", el)
		}
	})
}

func TestWakeDuringWait(t *testing.T) {
	kinds(t, func(t *testing.T, w *Waiter) {
		var waiting atomic.Bool
		go func() {
			for !waiting.Load() {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(5 * time.Millisecond) // most likely parked by now; either way it must return
			w.Wake()
		}()
		within(t, "Wait(-1) woken", func() { waiting.Store(true); w.Wait(-1) })
	})
}

func TestWaitTimesOut(t *testing.T) {
	kinds(t, func(t *testing.T, w *Waiter) {
		for _, d := range []time.Duration{100 * time.Microsecond, 3 * time.Millisecond} {
			start := time.Now()
			within(t, "Wait(d)", func() { w.Wait(d) })
			if el := time.Since(start); el < d {
				t.Fatalf("Wait(%v) returned after %v", d, el)
			}
		}
		w.Wait(0) // does not block
	})
}

// TestNoLostWake: a waker publishes a count and wakes; the waiter, which
// sleeps with no timeout, must see every value up to the last.
func TestNoLostWake(t *testing.T) {
	kinds(t, func(t *testing.T, w *Waiter) {
		const n = 20000
		var count atomic.Int64
		go func() {
			for range n {
				count.Add(1)
				w.Wake()
			}
		}()
		within(t, "the waiter seeing every wake", func() {
			for count.Load() < n {
				w.Wait(-1)
			}
		})
	})
}

func TestWakeAfterClose(t *testing.T) {
	kinds(t, func(t *testing.T, w *Waiter) {
		w.Close()
		w.Wake() // a hook that fires late: no panic, no stray descriptor write
	})
}

func TestHooks(t *testing.T) {
	var h Hooks
	h.Call() // none: no-op
	var a, b atomic.Int32
	stopA := h.Add(func() { a.Add(1) })
	stopB := h.Add(func() { b.Add(1) })
	h.Call()
	stopA()
	stopA() // once
	h.Call()
	stopB()
	h.Call()
	if a.Load() != 1 || b.Load() != 2 {
		t.Fatalf("calls: a %d (want 1), b %d (want 2)", a.Load(), b.Load())
	}
}

func BenchmarkWakeRoundTrip(b *testing.B) {
	for _, kind := range []string{"timerfd", "fallback"} {
		b.Run(kind, func(b *testing.B) {
			w, back := New(), New()
			if kind == "fallback" {
				w, back = &Waiter{}, &Waiter{}
				w.initFallback()
				back.initFallback()
			}
			defer w.Close()
			defer back.Close()
			stop := make(chan struct{})
			go func() {
				for {
					w.Wait(-1)
					select {
					case <-stop:
						return
					default:
					}
					back.Wake()
				}
			}()
			for b.Loop() {
				w.Wake()
				back.Wait(-1)
			}
			close(stop)
			w.Wake()
		})
	}
}
