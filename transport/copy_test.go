package transport

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// copyBytes is the size of the large same-host copy in these tests: well
// over parallelCopyMin, so that it is split among helpers.
const copyBytes = 32 << 20

// copyFixture is a large copy's spans, and a TCP echo in this process to
// ask while it runs.
type copyFixture struct {
	src, dst []byte
	spans    []copySpan
	conn     net.Conn
}

func newCopyFixture(t *testing.T) *copyFixture {
	t.Helper()
	f := &copyFixture{src: make([]byte, copyBytes), dst: make([]byte, copyBytes)}
	for i := range f.src {
		f.src[i] = byte(i*7 + i>>12)
	}
	// Four spans of unequal length, as a READ of scattered blocks makes.
	off := 0
	for _, n := range []int{1 << 20, 13 << 20, 2 << 20, copyBytes - 16<<20} {
		f.spans = append(f.spans, copySpan{f.dst[off : off+n], f.src[off : off+n], off})
		off += n
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	if f.conn, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.conn.Close() })
	f.ask()      // the echo's goroutine is up
	runtime.GC() // the collection the buffers started is not the copies'
	return f
}

// ask sends one byte to the echo and returns how long its answer took.
func (f *copyFixture) ask() time.Duration {
	start := time.Now()
	b := []byte{1}
	if _, err := f.conn.Write(b); err != nil {
		panic(err)
	}
	if _, err := io.ReadFull(f.conn, b); err != nil {
		panic(err)
	}
	return time.Since(start)
}

// copy runs the copy on w goroutines and returns how long it took, after
// checking the bytes.
func (f *copyFixture) copy(t *testing.T, w int) time.Duration {
	clear(f.dst)
	start := time.Now()
	parallelCopy(f.spans, copyBytes, w)
	took := time.Since(start)
	if !bytes.Equal(f.dst, f.src) {
		t.Fatal("the copy's bytes differ")
	}
	return took
}

// beside runs the copy on w goroutines while this goroutine asks the echo,
// trials times, and returns the answers' times and the copies', each
// sorted, and the median CPU the process used beyond cores cores in the
// 20 ms after a copy returned. A copy's answer counts from just after the
// copy started.
func (f *copyFixture) beside(t *testing.T, w, trials, cores int) (answers, copies []time.Duration, extra time.Duration) {
	var extras []time.Duration
	for range trials {
		started := make(chan struct{})
		done := make(chan time.Duration, 1)
		go func() {
			close(started)
			start := time.Now()
			parallelCopy(f.spans, copyBytes, w)
			done <- time.Since(start)
		}()
		<-started
		answers = append(answers, f.ask())
		select {
		case took := <-done:
			copies = append(copies, took)
			extras = append(extras, cpuBeyond(cores, 20*time.Millisecond))
		case <-time.After(10 * time.Second):
			t.Fatal("the copy has not ended after 10 s")
		}
		if !bytes.Equal(f.dst, f.src) {
			t.Fatal("the copy's bytes differ")
		}
	}
	slices.Sort(answers)
	slices.Sort(copies)
	slices.Sort(extras)
	return answers, copies, median(extras)
}

// cpuBeyond sleeps for d and returns the CPU time the process used
// meanwhile beyond cores cores' worth (the busy goroutine's). Other
// processes on the machine can only lower it.
func cpuBeyond(cores int, d time.Duration) time.Duration {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c0, t0 := cpu(), time.Now()
	time.Sleep(d)
	return cpu() - c0 - time.Duration(cores)*time.Since(t0)
}

// median returns the median of sorted durations.
func median(d []time.Duration) time.Duration { return d[len(d)/2] }

// busy runs a goroutine that only computes, as an engine's does, until
// the test ends.
func busy(t *testing.T) {
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		x := uint64(1)
		for !stop.Load() {
			for range 1 << 12 {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
			}
		}
		_ = x
	}()
	t.Cleanup(func() { stop.Store(true); <-done })
}

// The margin a socket answer may take beyond a copy's own time: a
// goroutine made runnable while every processor computes waits for the
// scheduler's time slice (10 ms) at worst, and a loaded machine adds its
// own delays.
const answerMargin = 25 * time.Millisecond

// afterMargin is the CPU beyond the busy goroutine's core the process may
// use in the 20 ms after a copy (timers, the sleep's own wake-up): a
// goroutine of the copy left running would use up to 20 ms more.
const afterMargin = 5 * time.Millisecond

// TestLargeCopyBesideBusyGoroutine: a large same-host copy, with its
// helpers (as many as GOMAXPROCS allows) and a goroutine that only
// computes, delays a socket answer in the same process by no more than
// the copy's own time: the copy's goroutines take no processor for
// longer than the copy, and none is left spinning after it.
func TestLargeCopyBesideBusyGoroutine(t *testing.T) {
	f := newCopyFixture(t)
	cfg := TCPConfig{}
	w := cfg.copyWorkers()
	var own []time.Duration
	for range 3 {
		own = append(own, f.copy(t, w))
	}
	slices.Sort(own)
	busy(t)
	answers, copies, extra := f.beside(t, w, 7, 1)
	// The median, against the slower of the copy alone and the copy beside
	// the busy goroutine (measured in the same trials).
	limit := max(median(own), median(copies)) + answerMargin
	if a := median(answers); a > limit {
		t.Fatalf("a socket answer beside the copy took %v at the median (copy alone %v, beside %v; answers %v)", a, own, copies, answers)
	}
	// Once the copy has returned, nothing of it runs.
	if extra > afterMargin {
		t.Fatalf("in the 20 ms after a copy the process used %v of CPU beyond the busy goroutine's core (median)", extra)
	}
}

// TestCopyMadeAtTwoProcsRunsAtOne: GOMAXPROCS falls from 2 to 1 (a
// container's CPU limit changing) between a plane's configuration and its
// copy. The copy then runs on one goroutine, and a copy split for two
// goroutines still ends, with its bytes, without stalling a socket answer
// beyond its own time: no goroutine of ours waits on another that cannot
// run.
func TestCopyMadeAtTwoProcsRunsAtOne(t *testing.T) {
	prev := runtime.GOMAXPROCS(2)
	defer runtime.GOMAXPROCS(prev)
	cfg := TCPConfig{}
	if w := cfg.copyWorkers(); w != 2 {
		t.Fatalf("copyWorkers at GOMAXPROCS 2: %d", w)
	}
	f := newCopyFixture(t)
	runtime.GOMAXPROCS(1)
	if w := cfg.copyWorkers(); w != 1 {
		t.Fatalf("copyWorkers read GOMAXPROCS when configured: %d at GOMAXPROCS 1", w)
	}
	// Split for two, as a copy sized before the change would be, each
	// trial beside a copy on one goroutine, so that both meet the same
	// load (a loaded CI machine's moves from trial to trial).
	var own, answers, copies, extras []time.Duration
	for range 5 {
		own = append(own, f.copy(t, 1))
		a, c, x := f.beside(t, 2, 1, 0)
		answers, copies, extras = append(answers, a...), append(copies, c...), append(extras, x)
	}
	for _, d := range [][]time.Duration{own, answers, copies, extras} {
		slices.Sort(d)
	}
	extra := median(extras)
	// Against the copy on one goroutine, with room for the asking
	// goroutines' turns on the one processor and a race detector's
	// uneven cost.
	if c := median(copies); c > 4*median(own)+answerMargin {
		t.Fatalf("a copy split for two goroutines took %v at GOMAXPROCS 1, against %v on one", copies, own)
	}
	limit := max(median(own), median(copies)) + answerMargin
	if a := median(answers); a > limit {
		t.Fatalf("a socket answer beside the copy took %v at the median (copy alone %v, beside %v)", a, own, copies)
	}
	// Nothing else runs here: the process idles after a copy.
	if extra > afterMargin {
		t.Fatalf("in the 20 ms after a copy the process used %v of CPU (median)", extra)
	}
}

// TestCopySharesAreNeverSmall: the shares a parallel copy's goroutines
// take cover the copy once, in order, and none is smaller than copyChunk
// unless the whole copy is (the size from which Go's memmove writes
// around the cache), whatever the total.
func TestCopySharesAreNeverSmall(t *testing.T) {
	for _, total := range []int{1, copyChunk - 1, copyChunk, copyChunk + 1, 2*copyChunk - 1, 2 * copyChunk,
		2*copyChunk + 4096, 9 * 512 << 10, 7 << 20, 1024 * 7 << 10, 64<<20 + 3} {
		j := &copyJob{total: total}
		at := 0
		for {
			from, to, ok := j.take()
			if !ok {
				break
			}
			if from != at || to <= from || to > total {
				t.Fatalf("total %d: share [%d, %d) after %d", total, from, to, at)
			}
			if to-from < copyChunk && to-from != total {
				t.Fatalf("total %d: a share of %d bytes", total, to-from)
			}
			at = to
		}
		if at != total {
			t.Fatalf("total %d: shares ended at %d", total, at)
		}
	}
}

// BenchmarkColdCopy copies 4.5 MiB (one image's embedding) from memory
// the cache does not hold, each copy from and to the next 4.5 MiB of two
// buffers of up to 1 GiB each: in pieces of 512 KiB and of copyChunk (Go's
// memmove writes around the cache from 1 MiB on amd64), in one piece, and
// through parallelCopy on two goroutines. Under -benchtime 1x the buffers
// are small and warm: it only checks that it runs.
//
//	go test -run '^$' -bench ColdCopy -benchtime 2000x ./transport
func BenchmarkColdCopy(b *testing.B) {
	const size = 4608 << 10
	for _, c := range []struct {
		name  string
		piece int
		w     int
	}{{"pieces-512KiB", 512 << 10, 1}, {"pieces-1MiB", copyChunk, 1}, {"whole", size, 1}, {"parallel-2", size, 2}} {
		b.Run(c.name, func(b *testing.B) {
			n := min(b.N, (1<<30)/size) // entries a buffer holds
			src, dst := make([]byte, n*size), make([]byte, n*size)
			for i := range src {
				src[i], dst[i] = byte(i), byte(i>>8)
			}
			b.SetBytes(size)
			b.ResetTimer()
			for i := range b.N {
				at := (i % n) * size
				s, d := src[at:at+size], dst[(at+size*(n/2))%(n*size):][:size]
				if c.w > 1 {
					parallelCopy([]copySpan{{d, s, 0}}, size, c.w)
					continue
				}
				for k := 0; k < size; k += c.piece {
					copy(d[k:min(k+c.piece, size)], s[k:min(k+c.piece, size)])
				}
			}
		})
	}
}
