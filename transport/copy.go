package transport

import (
	"sort"
	"sync"
	"sync/atomic"
)

// copySpan is one contiguous copy of a READ; off is where it starts in
// the READ's bytes.
type copySpan struct {
	dst, src []byte
	off      int
}

// parallelCopyMin is the smallest READ copied by more than one goroutine,
// each taking at least half of it: below it starting a helper costs more
// than the share of the copy it takes.
const parallelCopyMin = 2 << 20

// copyChunk is the share of a parallel copy a goroutine takes at a time,
// and a copy is never cut into smaller pieces than this (the last share
// takes what is left when less than another would be). It is the size
// from which Go's memmove on amd64 writes around the cache
// (non-temporal stores): in smaller pieces a cold copy first reads every
// line it then overwrites, and 4.5 MiB copied in 512 KiB pieces took 1.4
// times as long as in 1 MiB ones here. Helpers start late (an idle
// processor takes microseconds to a millisecond to run one), so shares
// are taken as they go, not split up front, and a helper that comes when
// none are left does nothing.
const copyChunk = 1 << 20

// parallelCopy copies spans, total bytes in all, on up to w goroutines,
// this one among them, and returns once every byte is copied. Helpers are
// started for this copy and end with it: nothing spins or lingers, and a
// copy waits (parked) only for helpers that took a chunk.
func parallelCopy(spans []copySpan, total, w int) {
	w = min(w, total/(parallelCopyMin/2))
	if w <= 1 {
		copyRange(spans, 0, total)
		return
	}
	j := &copyJob{spans: spans, total: total}
	for range w - 1 {
		go j.help()
	}
	j.work()
	// Helpers that come from now on leave at once; those that joined have
	// one chunk at most to finish.
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.joined.Wait()
}

// copyJob is one parallel copy: goroutines take copyChunk bytes at a time
// from next.
type copyJob struct {
	spans  []copySpan
	total  int
	next   atomic.Int64
	mu     sync.Mutex
	closed bool           // no more helpers join
	joined sync.WaitGroup // the helpers that did
}

func (j *copyJob) help() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	j.joined.Add(1)
	j.mu.Unlock()
	defer j.joined.Done()
	j.work()
}

// work copies shares until none are left.
func (j *copyJob) work() {
	for {
		from, to, ok := j.take()
		if !ok {
			return
		}
		copyRange(j.spans, from, to)
	}
}

// take claims the next share: copyChunk bytes, or all that is left when
// less than copyChunk would remain after it.
func (j *copyJob) take() (from, to int, ok bool) {
	for {
		at := j.next.Load()
		if at >= int64(j.total) {
			return 0, 0, false
		}
		end := min(at+copyChunk, int64(j.total))
		if int64(j.total)-end < copyChunk {
			end = int64(j.total)
		}
		if j.next.CompareAndSwap(at, end) {
			return int(at), int(end), true
		}
	}
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
