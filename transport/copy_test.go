package transport

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
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
func (f *copyFixture) beside(t *testing.T, w, trials, cores int) (answers, copies, extras []time.Duration) {
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
	return answers, copies, extras
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
	answers, copies, extras := f.beside(t, w, 7, 1)
	// The best trial, against the slower of the copy alone and the copy
	// beside the busy goroutine (measured in the same trials): a copy that
	// holds the processors past its end does so in every trial, while a
	// loaded machine spoils only some.
	limit := max(median(own), median(copies)) + answerMargin
	if a := answers[0]; a > limit {
		t.Fatalf("a socket answer beside the copy took %v at best (copy alone %v, beside %v; answers %v)", a, own, copies, answers)
	}
	// Once the copy has returned, nothing of it runs.
	if extra := extras[0]; extra > afterMargin {
		t.Fatalf("in the 20 ms after a copy the process used %v of CPU beyond the busy goroutine's core, at least (trials %v)", extra, extras)
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
		answers, copies, extras = append(answers, a...), append(copies, c...), append(extras, x...)
	}
	for _, d := range [][]time.Duration{own, answers, copies, extras} {
		slices.Sort(d)
	}
	// Against the copy on one goroutine, with room for the asking
	// goroutines' turns on the one processor and a race detector's
	// uneven cost.
	if c := median(copies); c > 4*median(own)+answerMargin {
		t.Fatalf("a copy split for two goroutines took %v at GOMAXPROCS 1, against %v on one", copies, own)
	}
	// The best trial: a goroutine that waits on one that cannot run
	// delays every one.
	limit := max(median(own), median(copies)) + answerMargin
	if a := answers[0]; a > limit {
		t.Fatalf("a socket answer beside the copy took %v at best (copy alone %v, beside %v)", a, own, copies)
	}
	// Nothing else runs here: the process idles after a copy.
	if extra := extras[0]; extra > afterMargin {
		t.Fatalf("in the 20 ms after a copy the process used %v of CPU, at least (trials %v)", extra, extras)
	}
}

// spansOf lays out runs of lens bytes back to back in dst and src.
func spansOf(dst, src []byte, lens []int) []copySpan {
	var s []copySpan
	off := 0
	for _, n := range lens {
		s = append(s, copySpan{dst[off : off+n], src[off : off+n], off})
		off += n
	}
	return s
}

// randomRuns returns the lengths of up to eight runs: short ones, ones
// just over copyChunk, and long ones.
func randomRuns(rng *rand.Rand) []int {
	var lens []int
	for range 1 + rng.IntN(8) {
		switch rng.IntN(3) {
		case 0:
			lens = append(lens, 1+rng.IntN(copyChunk))
		case 1:
			lens = append(lens, copyChunk+rng.IntN(copyChunk))
		default:
			lens = append(lens, 1+rng.IntN(6*copyChunk))
		}
	}
	return lens
}

// TestCopyPiecesAreWholeSpansOrLarge: the shares of a parallel copy cover
// it once, in order, and every memmove they make is a whole span or
// copyChunk bytes or more (the size from which Go's memmove writes around
// the cache), whatever the spans: runs that straddle where shares of
// copyChunk would end included.
func TestCopyPiecesAreWholeSpansOrLarge(t *testing.T) {
	layouts := [][]int{
		{1}, {copyChunk - 1}, {copyChunk + 1}, {2*copyChunk - 1}, {2*copyChunk + 4096}, {4608 << 10}, {64<<20 + 3},
		{3 << 19, 3 << 19, 3 << 19},              // 4.5 MiB as three runs of 1.5 MiB
		{17 << 16, 17 << 16, 17 << 16, 17 << 16}, // runs of 1.0625 MiB
		{copyChunk + 8192, copyChunk + 8192, copyChunk + 8192, copyChunk + 8192},
		{100 << 10, 10 << 20}, // a short run, then a long one
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		layouts = append(layouts, randomRuns(rng))
	}
	buf := make([]byte, 64<<20+3) // no layout is longer; the copy is not made
	for _, lens := range layouts {
		total := 0
		for _, n := range lens {
			total += n
		}
		spans := spansOf(buf, buf, lens)
		j := &copyJob{spans: spans, total: total}
		at := 0
		for {
			from, to, ok := j.take()
			if !ok {
				break
			}
			if from != at || to <= from || to > total {
				t.Fatalf("runs %v: share [%d, %d) after %d", lens, from, to, at)
			}
			eachPiece(spans, from, to, func(dst, _ []byte) {
				whole := false
				for _, s := range spans {
					whole = whole || len(dst) == len(s.dst) && &dst[0] == &s.dst[0]
				}
				if len(dst) < copyChunk && !whole {
					t.Fatalf("runs %v: share [%d, %d) copies %d bytes of a run", lens, from, to, len(dst))
				}
			})
			at = to
		}
		if at != total {
			t.Fatalf("runs %v: shares ended at %d of %d", lens, at, total)
		}
	}
}

// TestParallelCopyEachByteOnce: goroutines taking shares at once take
// each byte once (the shares tile the copy), and parallelCopy copies every byte, for totals around
// multiples of copyChunk, random runs, up to 16 goroutines and
// GOMAXPROCS changing between copies.
func TestParallelCopyEachByteOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for k := range 5 {
		for _, d := range []int{-4097, -1, 0, 1, 4096} {
			total := k*copyChunk + d
			if total <= 0 {
				continue
			}
			var lens []int
			for left := total; left > 0; {
				n := min(left, 1+rng.IntN(3*copyChunk))
				lens = append(lens, n)
				left -= n
			}
			lens = append(lens, 0) // an empty span at the end
			src, dst := make([]byte, total), make([]byte, total)
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			j := &copyJob{spans: spansOf(dst, src, lens), total: total}
			var mu sync.Mutex
			var shares [][2]int
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						from, to, ok := j.take()
						if !ok {
							return
						}
						mu.Lock()
						shares = append(shares, [2]int{from, to})
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			slices.SortFunc(shares, func(a, b [2]int) int { return a[0] - b[0] })
			at := 0
			for _, sh := range shares {
				if sh[0] != at || sh[1] <= sh[0] {
					t.Fatalf("total %d, runs %v: shares %v", total, lens, shares)
				}
				at = sh[1]
			}
			if at != total {
				t.Fatalf("total %d, runs %v: shares %v end at %d", total, lens, shares, at)
			}
			runtime.GOMAXPROCS(1 + rng.IntN(4))
			w := 1 + rng.IntN(16)
			parallelCopy(spansOf(dst, src, lens), total, w)
			if !bytes.Equal(dst, src) {
				t.Fatalf("total %d, runs %v, %d goroutines: the copy's bytes differ", total, lens, w)
			}
		}
	}
}

// BenchmarkColdCopy copies 4.5 MiB (one image's embedding), as one run,
// as three runs of 1.5 MiB, and in runs of 512 KiB, 128 KiB and 8 KiB
// (one block: an entry whose blocks are scattered), from memory the cache
// does not hold:
// each copy from and to the next 4.5 MiB of two buffers of up to 1 GiB
// each. It copies in pieces of 512 KiB, in the shares parallelCopy takes
// but on one goroutine, in one memmove per run, and through parallelCopy
// on two goroutines. Under -benchtime 1x the buffers are small and warm:
// it only checks that it runs.
//
//	go test -run '^$' -bench ColdCopy -benchtime 2000x ./transport
func BenchmarkColdCopy(b *testing.B) {
	const size = 4608 << 10
	for _, layout := range []struct {
		name string
		lens []int
	}{{"1-run", []int{size}}, {"3-runs", runsOfSize(size, size/3)}, {"9-runs", runsOfSize(size, size/9)},
		{"36-runs", runsOfSize(size, size/36)}, {"576-runs", runsOfSize(size, size/576)}} {
		for _, how := range []string{"pieces-512KiB", "shares", "per-run", "parallel-2"} {
			b.Run(layout.name+"/"+how, func(b *testing.B) {
				n := min(b.N, (1<<30)/size) // copies a buffer holds
				src, dst := make([]byte, n*size), make([]byte, n*size)
				for i := range src {
					src[i], dst[i] = byte(i), byte(i>>8)
				}
				b.SetBytes(size)
				b.ResetTimer()
				for i := range b.N {
					at := (i % n) * size
					spans := spansOf(dst[(at+size*(n/2))%(n*size):][:size], src[at:at+size], layout.lens)
					switch how {
					case "pieces-512KiB":
						for k := 0; k < size; k += 512 << 10 {
							copyRange(spans, k, min(k+512<<10, size))
						}
					case "shares":
						(&copyJob{spans: spans, total: size}).work()
					case "per-run":
						copyRange(spans, 0, size)
					case "parallel-2":
						parallelCopy(spans, size, 2)
					}
				}
			})
		}
	}
}

// runsOfSize cuts size bytes into runs of n.
func runsOfSize(size, n int) []int {
	var lens []int
	for ; size > 0; size -= n {
		lens = append(lens, min(n, size))
	}
	return lens
}
