package transport

import (
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// copySpan is one contiguous copy of a READ; off is where it starts in
// the READ's bytes.
type copySpan struct {
	dst, src []byte
	off      int
}

// parallelCopyMin is the smallest READ copied by more than one goroutine,
// each taking at least half of it: below it waking a helper costs more
// than the share of the copy it takes.
const parallelCopyMin = 2 << 20

// copyChunk is the share of a parallel copy a goroutine takes at a time.
// Helpers start late (waking a processor takes tens of microseconds to a
// millisecond here), so shares are taken as they go, not split up front.
const copyChunk = 512 << 10

// copyLinger is how long a helper stays after a copy for the next one:
// the CPU a lone large fetch pays for it, about what a helper's share of
// a 4 MiB copy costs.
const copyLinger = 500 * time.Microsecond

// copier runs one data plane's parallel copies. A helper that finished
// its share stays a while, spinning on its processor, and the next large
// copy hands it its job: on the 2-vCPU VMs this was measured on, a goroutine
// started on an idle processor ran 0.1–1.5 ms later, against about 3 ms
// for a whole 64 MiB copy on two cores, and a READ's copy ran about a
// sixth faster with helpers kept. Back-to-back large fetches are what
// this is for; a lone one pays copyLinger of one core per helper.
type copier struct {
	mu     sync.Mutex
	idle   []*copyHelper // lingering, newest last
	closed atomic.Bool   // set under mu

	// At most maxIdle helpers linger in the process, over all data
	// planes (lingering counts them): each holds a processor.
	maxIdle   int32
	lingering *atomic.Int32

	wg      *sync.WaitGroup // the data plane's: Close waits for helpers
	now     func() int64    // monotonic nanoseconds; tests replace it
	spawned atomic.Uint64   // helpers started (tests)
	alive   atomic.Int32    // helpers running (tests)
}

// copyHelper is one helper's mailbox: a copy hands it a job under
// copier.mu, as it takes it off the idle list.
type copyHelper struct{ job atomic.Pointer[copyJob] }

// copyJob is one parallel copy. Goroutines take copyChunk bytes at a
// time from next. Helpers claim a slot before they copy; the copy's own
// goroutine closes the slots when it runs out of bytes and waits only
// for the helpers that claimed one, not for those yet to start.
type copyJob struct {
	spans []copySpan
	total int
	next  atomic.Int64
	slots atomic.Int32
	// left counts the slots not given back: unclaimed ones the copy's
	// goroutine gives back at once, claimed ones their helper when done.
	// A helper that takes it to zero closes done.
	left atomic.Int32
	done chan struct{}
}

var monoEpoch = time.Now()

// lingering counts the copy helpers spinning in this process.
var lingering atomic.Int32

func newCopier(wg *sync.WaitGroup) *copier {
	// Spinning helpers leave at least one processor to everything else.
	return &copier{wg: wg, maxIdle: int32(runtime.GOMAXPROCS(0) - 1), lingering: &lingering,
		now: func() int64 { return int64(time.Since(monoEpoch)) }}
}

// copy copies spans, total bytes in all, on up to w goroutines, this one
// among them; it returns once every byte is copied.
func (c *copier) copy(spans []copySpan, total, w int) {
	if w <= 1 {
		copyRange(spans, 0, total)
		return
	}
	j := &copyJob{spans: spans, total: total, done: make(chan struct{})}
	j.slots.Store(int32(w - 1))
	j.left.Store(int32(w - 1))
	handed := 0
	c.mu.Lock()
	closed := c.closed.Load()
	for ; handed < w-1 && len(c.idle) > 0; handed++ {
		h := c.idle[len(c.idle)-1]
		c.idle = c.idle[:len(c.idle)-1]
		h.job.Store(j)
	}
	c.mu.Unlock()
	if !closed {
		for range w - 1 - handed {
			c.spawned.Add(1)
			c.wg.Add(1) // the caller is one of wg's: it is not zero
			go c.helper(j)
		}
	}
	j.work()
	n := max(j.slots.Swap(math.MinInt32/2), 0) // slots no helper claimed
	if j.left.Add(-n) == 0 {
		return
	}
	// A helper that joined has a chunk at most to go: wait for it
	// spinning. Parked, this goroutine would be readied onto the
	// helper's processor, where the helper then spins (traced: 0.5 ms).
	// With one processor the helpers need this one: park at once.
	for end := c.now() + int64(joinSpin); c.maxIdle > 0 && j.left.Load() > 0 && c.now() < end; {
	}
	<-j.done
}

// joinSpin bounds the spin for helpers' last chunks, many times what one
// takes: a helper the OS took off its core is waited for parked.
const joinSpin = time.Millisecond

// work copies chunks until none are left.
func (j *copyJob) work() {
	for {
		from := int(j.next.Add(copyChunk)) - copyChunk
		if from >= j.total {
			return
		}
		copyRange(j.spans, from, min(from+copyChunk, j.total))
	}
}

// help copies a share of j if it still takes helpers.
func (j *copyJob) help() {
	if j.slots.Add(-1) < 0 {
		return
	}
	j.work()
	if j.left.Add(-1) == 0 {
		close(j.done)
	}
}

func (c *copier) helper(j *copyJob) {
	defer c.wg.Done()
	c.alive.Add(1)
	defer c.alive.Add(-1)
	h := &copyHelper{}
	for j != nil {
		j.help()
		j = c.linger(h, c.now()+int64(copyLinger))
	}
}

// linger waits until deadline for a copy to hand h a job, and returns it,
// or nil: time to go.
func (c *copier) linger(h *copyHelper, deadline int64) *copyJob {
	if c.lingering.Add(1) > c.maxIdle {
		c.lingering.Add(-1)
		return nil
	}
	defer c.lingering.Add(-1)
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil
	}
	c.idle = append(c.idle, h)
	c.mu.Unlock()
	// Spin without yielding: runtime.Gosched would put this goroutine on
	// the global run queue, where it waited up to 4 ms (traced) while the
	// processor it left ran the very copy it was to join.
	for h.job.Load() == nil && c.now() < deadline && !c.closed.Load() {
	}
	if j := h.job.Swap(nil); j != nil {
		return j
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.idle, h); i >= 0 {
		c.idle = slices.Delete(c.idle, i, i+1)
		return nil
	}
	// A copy took h off the list as we were leaving: its job is stored.
	return h.job.Swap(nil)
}

// close sends lingering helpers away at once and starts no more; copies
// still run, on their callers' goroutines.
func (c *copier) close() {
	c.mu.Lock()
	c.closed.Store(true)
	c.mu.Unlock()
}

// copyRange copies bytes [from, to) of the READ spans make up.
func copyRange(spans []copySpan, from, to int) {
	i := sort.Search(len(spans), func(i int) bool { return spans[i].off+len(spans[i].dst) > from })
	for ; i < len(spans) && spans[i].off < to; i++ {
		s := spans[i]
		lo, hi := max(from-s.off, 0), min(to-s.off, len(s.dst))
		copy(s.dst[lo:hi], s.src[lo:hi])
	}
}
