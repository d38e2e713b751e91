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

// copyChunk is the smallest piece a copy cuts a span into: every memmove
// a copy makes is a whole span or copyChunk bytes or more. From 1 MiB,
// Go's memmove on amd64 writes around the cache (non-temporal stores),
// except on Intel CPUs with fast short REP MOVSB, where every copy of
// 2 KiB or more into a 16-byte-aligned destination uses REP MOVSQ
// instead. In smaller pieces a
// cold copy first reads every line it then overwrites: 4.5 MiB copied in
// 512 KiB pieces took 1.4 times as long as in 1 MiB ones here (AMD
// EPYC; BenchmarkColdCopy).
const copyChunk = 1 << 20

// parallelCopy copies spans, total bytes in all, on up to w goroutines,
// this one among them, and returns once every byte is copied. Helpers are
// started for this copy and end with it: nothing spins or lingers, and a
// copy waits (parked) only for the helpers that joined it. Helpers start
// late (an idle processor takes microseconds to a millisecond to run
// one), so shares are taken as they go, not split up front, and a helper
// that comes when none are left does nothing.
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
	// one share at most to finish.
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.joined.Wait()
}

// copyJob is one parallel copy: goroutines take shares of it from next
// (take).
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

// take claims the next share, bytes [from, to) of the copy: about
// copyChunk bytes, its end moved so that it cuts no span into a piece
// under copyChunk (see end).
func (j *copyJob) take() (from, to int, ok bool) {
	for {
		at := int(j.next.Load())
		if at >= j.total {
			return 0, 0, false
		}
		end := j.end(at)
		if j.next.CompareAndSwap(int64(at), int64(end)) {
			return at, end, true
		}
	}
}

// end is where a share starting at at ends. It starts where the last one
// ended: at a span's start, or inside a span with copyChunk bytes or more
// of it left. It goes copyChunk bytes on, or to the copy's end when less
// than copyChunk would be left after it. An end inside a span moves back
// to the span's start when the share began before that span (the next
// share takes it whole or in large pieces), else on to the span's end
// when less than copyChunk of it would be left.
func (j *copyJob) end(at int) int {
	end := at + copyChunk
	if j.total-end < copyChunk {
		return j.total
	}
	i := sort.Search(len(j.spans), func(i int) bool { return j.spans[i].off+len(j.spans[i].dst) > end })
	if i == len(j.spans) || j.spans[i].off == end {
		return end // on a span's edge
	}
	s := j.spans[i]
	switch {
	case s.off > at:
		return s.off
	case s.off+len(s.dst)-end < copyChunk:
		return s.off + len(s.dst)
	}
	return end
}

// copyRange copies bytes [from, to) of the READ spans make up.
func copyRange(spans []copySpan, from, to int) {
	eachPiece(spans, from, to, func(dst, src []byte) { copy(dst, src) })
}

// eachPiece calls f with each contiguous piece of bytes [from, to) of the
// READ spans make up: one per span it reaches, in order.
func eachPiece(spans []copySpan, from, to int, f func(dst, src []byte)) {
	i := sort.Search(len(spans), func(i int) bool { return spans[i].off+len(spans[i].dst) > from })
	for ; i < len(spans) && spans[i].off < to; i++ {
		s := spans[i]
		lo, hi := max(from-s.off, 0), min(to-s.off, len(s.dst))
		f(s.dst[lo:hi], s.src[lo:hi])
	}
}
