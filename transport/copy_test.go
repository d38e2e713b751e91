package transport

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// A copier lands every byte where one copy per span would, whatever the
// span sizes, the number of goroutines and where chunks cut spans.
func TestCopyParallel(t *testing.T) {
	c := testCopier(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 40 {
		var spans []copySpan
		total := 0
		for range 1 + rng.IntN(12) {
			n := 1 + rng.IntN(3*copyChunk)
			if trial%4 == 0 {
				n = copyChunk // cuts on span boundaries
			}
			src := make([]byte, n)
			seed := byte(rng.Uint32())
			for i := range src {
				src[i] = byte(i*7+i>>9) + seed
			}
			spans = append(spans, copySpan{dst: make([]byte, n), src: src, off: total})
			total += n
		}
		w := 1 + trial%4
		c.copy(spans, total, w)
		for i, s := range spans {
			if !bytes.Equal(s.dst, s.src) {
				t.Fatalf("trial %d, %d goroutines: span %d of %d (%d bytes) differs", trial, w, i, len(spans), len(s.src))
			}
		}
	}
}

// testCopier returns a copier on the real clock whose helpers are gone
// when the test ends.
func testCopier(t *testing.T) *copier {
	var wg sync.WaitGroup
	c := newCopier(&wg)
	t.Cleanup(func() {
		c.close()
		waitGroup(t, &wg)
	})
	return c
}

// waitGroup waits for wg, failing the test after 10 s.
func waitGroup(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("copy helpers still running after 10 s")
	}
}

// idleHelpers waits until n helpers linger, failing after 10 s.
func idleHelpers(t *testing.T, c *copier, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		got := len(c.idle)
		c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d helpers linger, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// copyOf returns spans copying src into a new buffer, as one READ of
// three runs, and the buffer.
func copyOf(src []byte) ([]copySpan, []byte) {
	dst := make([]byte, len(src))
	a, b := len(src)/3, 2*len(src)/3
	return []copySpan{
		{dst: dst[:a], src: src[:a], off: 0},
		{dst: dst[a:b], src: src[a:b], off: a},
		{dst: dst[b:], src: src[b:], off: b},
	}, dst
}

func filled(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i>>11) + seed
	}
	return b
}

// A helper stays after its copy until copyLinger passes on the copier's
// clock, and the next copy hands it its job instead of starting another.
func TestCopierLingers(t *testing.T) {
	var wg sync.WaitGroup
	c := newCopier(&wg)
	var clock atomic.Int64
	c.now = clock.Load
	c.maxIdle, c.lingering = 1, new(atomic.Int32) // whatever GOMAXPROCS and other tests do
	src := filled(5*copyChunk, 1)
	for round := range 3 {
		spans, dst := copyOf(src)
		c.copy(spans, len(src), 2)
		if !bytes.Equal(dst, src) {
			t.Fatalf("round %d: copy differs", round)
		}
		idleHelpers(t, c, 1)
		if n := c.spawned.Load(); n != 1 {
			t.Fatalf("round %d: %d helpers started, want the first one only", round, n)
		}
		clock.Add(int64(copyLinger) / 4) // within the linger each round
	}
	clock.Add(int64(copyLinger))
	waitGroup(t, &wg)
	idleHelpers(t, c, 0)
	c.close()
}

// Close sends lingering helpers away without waiting out the linger, and
// copies after it run on their caller alone.
func TestCopierClose(t *testing.T) {
	var wg sync.WaitGroup
	c := newCopier(&wg)
	c.now = func() int64 { return 0 } // the linger never ends by itself
	c.maxIdle, c.lingering = 1, new(atomic.Int32)
	src := filled(4*copyChunk, 2)
	spans, _ := copyOf(src)
	wg.Add(1) // the caller, as a data plane's goroutine
	c.copy(spans, len(src), 2)
	idleHelpers(t, c, 1)
	c.close()
	wg.Done()
	waitGroup(t, &wg)
	spans, dst := copyOf(src)
	c.copy(spans, len(src), 2)
	if !bytes.Equal(dst, src) || c.spawned.Load() != 1 {
		t.Fatalf("after close: copied %v, %d helpers started in all", bytes.Equal(dst, src), c.spawned.Load())
	}
}

// Helpers spin while they linger, a processor each: no more of them stay
// than maxIdle (GOMAXPROCS-1 by default) over all the copiers of a
// process, and the rest leave at once.
func TestCopierLingersAtMostMaxIdle(t *testing.T) {
	var wg sync.WaitGroup
	a, b := newCopier(&wg), newCopier(&wg)
	if want := int32(runtime.GOMAXPROCS(0) - 1); a.maxIdle != want || a.lingering != &lingering {
		t.Fatalf("maxIdle %d, want GOMAXPROCS-1 = %d, counted process-wide: %v", a.maxIdle, want, a.lingering == &lingering)
	}
	stopped := func() int64 { return 0 } // the linger never ends by itself
	count := new(atomic.Int32)           // the two copiers' process
	for _, c := range []*copier{a, b} {
		c.now, c.maxIdle, c.lingering = stopped, 1, count
	}
	src := filled(6*copyChunk, 4)
	spans, dst := copyOf(src)
	a.copy(spans, len(src), 4)
	if !bytes.Equal(dst, src) || a.spawned.Load() != 3 {
		t.Fatalf("copied %v, %d helpers started, want 3", bytes.Equal(dst, src), a.spawned.Load())
	}
	// One lingers, spinning until the clock moves; the other two leave.
	idleHelpers(t, a, 1)
	for deadline := time.Now().Add(10 * time.Second); a.alive.Load() != 1; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d helpers running, want the one lingering", a.alive.Load())
		}
	}
	// The other copier's helper finds the one place taken, and leaves.
	spans, dst = copyOf(src)
	b.copy(spans, len(src), 2)
	for deadline := time.Now().Add(10 * time.Second); b.alive.Load() != 0 || b.spawned.Load() != 1; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("second copier: %d helpers started, %d running, want 1 and 0", b.spawned.Load(), b.alive.Load())
		}
	}
	if !bytes.Equal(dst, src) || count.Load() != 1 {
		t.Fatalf("second copy: copied %v, %d lingering in all", bytes.Equal(dst, src), count.Load())
	}
	a.close()
	b.close()
	waitGroup(t, &wg)
}

// A copy handed to a helper that never takes it still ends, every byte
// copied by its caller: it waits only for helpers that joined.
func TestCopierHelperNeverComes(t *testing.T) {
	var wg sync.WaitGroup
	c := newCopier(&wg)
	stuck := &copyHelper{} // listed as lingering, no goroutine behind it
	c.idle = append(c.idle, stuck)
	src := filled(3*copyChunk+5, 3)
	spans, dst := copyOf(src)
	done := make(chan struct{})
	go func() { c.copy(spans, len(src), 2); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("copy waits for a helper that never came")
	}
	if !bytes.Equal(dst, src) || stuck.job.Load() == nil || c.spawned.Load() != 0 {
		t.Fatalf("copied %v, handed %v, %d spawned", bytes.Equal(dst, src), stuck.job.Load() != nil, c.spawned.Load())
	}
	// The job reaches its helper late: it has no share left to take.
	stuck.job.Load().help()
	c.close()
	waitGroup(t, &wg)
}

// Copies from many goroutines at once, helpers handed from one to the
// next, each land exactly their own bytes.
func TestCopierConcurrent(t *testing.T) {
	c := testCopier(t)
	var callers sync.WaitGroup
	for g := range 6 {
		callers.Add(1)
		go func() {
			defer callers.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 20 {
				src := filled(1+rng.IntN(3*copyChunk), byte(g*31+i))
				spans, dst := copyOf(src)
				c.copy(spans, len(src), 1+rng.IntN(4))
				if !bytes.Equal(dst, src) {
					t.Errorf("caller %d copy %d (%d bytes) differs", g, i, len(src))
					return
				}
			}
		}()
	}
	callers.Wait()
}

// copyRange copies exactly [from, to) of the spans' concatenation.
func TestCopyRange(t *testing.T) {
	spans := []copySpan{
		{dst: make([]byte, 3), src: []byte("abc"), off: 0},
		{dst: make([]byte, 2), src: []byte("de"), off: 3},
		{dst: make([]byte, 4), src: []byte("fghi"), off: 5},
	}
	copyRange(spans, 2, 6)
	got := string(bytes.Join([][]byte{spans[0].dst, spans[1].dst, spans[2].dst}, []byte("|")))
	if want := "\x00\x00c|de|f\x00\x00\x00"; got != want {
		t.Fatalf("copied %q, want %q", got, want)
	}
}

// A same-host READ large enough to be copied by several goroutines lands
// every block where its ids say, with runs of many lengths on both sides.
func TestSharedLargeRead(t *testing.T) {
	const blocks, size = 1024, 8 << 10
	cr, pr := newRegion(t, blocks, size), newSharedRegion(t, blocks, size)
	for b := range blocks {
		for i := range pr.Block(b) {
			pr.Block(b)[i] = pattern(b, i)
		}
	}
	c := newTCP(t, cr, TCPConfig{CopyWorkers: 3})
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	// Runs of 1 to 40 blocks, taken in a shuffled order on each side.
	var local, remote []int
	for start := 0; start < 900; {
		n := min(1+rng.IntN(40), 900-start)
		for b := start; b < start+n; b++ {
			local = append(local, b)
		}
		start += n
	}
	remote = rng.Perm(blocks)[:len(local)]
	slices.Sort(remote[:len(remote)/2]) // long runs in the first half
	if len(local)*size < 2*parallelCopyMin {
		t.Fatalf("READ of %d bytes is not split", len(local)*size)
	}
	h, err := c.PostRead(local, peer.Agent, remote, []byte("s:m"))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Complete || c.copies.Load() != 1 {
		t.Fatalf("READ: %v, %d copies", got, c.copies.Load())
	}
	for i, b := range local {
		if !bytes.Equal(cr.Block(b), pr.Block(remote[i])) {
			t.Fatalf("local block %d does not hold remote block %d", b, remote[i])
		}
	}
}
