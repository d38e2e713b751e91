package connector

import (
	"cmp"
	"container/heap"
	"slices"

	"github.com/ecxfer/ecxfer/xfer"
)

// backlogBytes bounds the requests waiting, by their size (see cost).
const backlogBytes = 64 << 20

// cost is what a waiting request counts against backlogBytes.
func cost(m xfer.Message) int64 { return int64(len(m.Payload)+len(m.Identity)) + 64 }

// backlog holds the requests waiting for a step: a queue per consumer
// (control-plane identity), in arrival order, the consumers with requests
// waiting taken in turn, newcomers behind those waiting. A step touches
// what it takes and drops and one entry per consumer waiting: no step
// walks the requests that go on waiting, however many a flood keeps there.
type backlog struct {
	queues  map[string]*queue
	turn    []*queue // the consumers with requests waiting, in turn
	next    int      // where the next take starts in turn
	n       int      // requests waiting
	bytes   int64    // their cost
	seq     uint64   // arrivals so far
	dropped uint64

	counts, sizes []int64 // trim's
	cands         candidates
}

// queue is one consumer's waiting requests, oldest first, from head.
type queue struct {
	id   string
	msgs []xfer.Message
	seqs []uint64 // each request's arrival
	cum  []int64  // cost of msgs[:i+1], since the slice began
	head int
	// trim's, while it runs: requests kept so far, their cost
	keptN     int
	keptBytes int64
	at        int // the next request trim looks at
}

func (q *queue) len() int { return len(q.msgs) - q.head }

// costTo is the cost of the waiting requests before msgs[i].
func (q *queue) costTo(i int) int64 {
	if i == 0 {
		return 0
	}
	base := int64(0)
	if q.head > 0 {
		base = q.cum[q.head-1]
	}
	return q.cum[i-1] - base
}

// add queues m, arrived now, behind its consumer's requests.
func (b *backlog) add(m xfer.Message) {
	if b.queues == nil {
		b.queues = map[string]*queue{}
	}
	q := b.queues[string(m.Identity)]
	if q == nil {
		q = &queue{id: string(m.Identity)}
		b.queues[q.id] = q
	}
	if q.len() == 0 {
		b.turn = append(b.turn, q)
	}
	c := cost(m)
	last := int64(0)
	if len(q.cum) > 0 {
		last = q.cum[len(q.cum)-1]
	}
	b.seq++
	q.msgs = append(q.msgs, m)
	q.seqs = append(q.seqs, b.seq)
	q.cum = append(q.cum, last+c)
	b.n++
	b.bytes += c
}

// take appends to dst up to total requests, at most per of one consumer,
// each consumer's in order, the consumers in turn from where the last
// take stopped; it drops them from the backlog.
func (b *backlog) take(dst []xfer.Message, total, per int) []xfer.Message {
	start, visited := b.next, 0
	for ; visited < len(b.turn) && len(dst) < total; visited++ {
		q := b.turn[(start+visited)%len(b.turn)]
		k := min(per, q.len(), total-len(dst))
		dst = append(dst, q.msgs[q.head:q.head+k]...)
		b.pop(q, k)
	}
	if len(b.turn) > 0 {
		b.next = (start + visited) % len(b.turn)
	}
	b.prune()
	return dst
}

// pop drops the k oldest requests of q.
func (b *backlog) pop(q *queue, k int) {
	b.n -= k
	b.bytes -= q.costTo(q.head + k)
	clear(q.msgs[q.head : q.head+k])
	q.head += k
	q.compact()
}

// compact keeps q's slices in proportion to what waits: it moves the
// waiting requests to the front once most of the slice is taken, and
// gives the slices back once they are far larger than what waits (a
// consumer that flooded once holds no more than it has waiting).
func (q *queue) compact() {
	n := q.len()
	if n == 0 {
		q.msgs, q.seqs, q.cum, q.head = q.msgs[:0], q.seqs[:0], q.cum[:0], 0
	}
	shrink := cap(q.msgs) > 4*(n+64)
	if !shrink && (q.head < 64 || q.head <= len(q.msgs)/2) {
		return
	}
	base := int64(0)
	if q.head > 0 {
		base = q.cum[q.head-1]
	}
	msgs, seqs, cum := q.msgs[:0], q.seqs[:0], q.cum[:0]
	if shrink {
		msgs, seqs, cum = make([]xfer.Message, 0, 2*n), make([]uint64, 0, 2*n), make([]int64, 0, 2*n)
	}
	old := len(q.msgs)
	msgs = append(msgs, q.msgs[q.head:]...)
	seqs = append(seqs, q.seqs[q.head:]...)
	for _, c := range q.cum[q.head:] {
		cum = append(cum, c-base)
	}
	if !shrink {
		clear(q.msgs[n:old]) // the stale tail, so that it keeps nothing alive
	}
	q.msgs, q.seqs, q.cum, q.head = msgs, seqs, cum, 0
}

// truncate drops q's requests from msgs[i] on, the newest.
func (b *backlog) truncate(q *queue, i int) {
	k := len(q.msgs) - i
	b.n -= k
	b.bytes -= q.costTo(len(q.msgs)) - q.costTo(i)
	b.dropped += uint64(k)
	clear(q.msgs[i:])
	q.msgs, q.seqs, q.cum = q.msgs[:i], q.seqs[:i], q.cum[:i]
	q.compact()
}

// prune drops the consumers with nothing waiting from the turn (and
// forgets them), keeping the turn's place.
func (b *backlog) prune() {
	// The turn from next, so that consumers arriving later join behind
	// every one waiting.
	slices.Reverse(b.turn[:b.next])
	slices.Reverse(b.turn[b.next:])
	slices.Reverse(b.turn)
	kept := b.turn[:0]
	for _, q := range b.turn {
		if q.len() > 0 {
			kept = append(kept, q)
			continue
		}
		delete(b.queues, q.id)
	}
	clear(b.turn[len(kept):])
	b.turn, b.next = kept, 0
}

// trim keeps the backlog within maxN requests and maxBytes. Past either,
// what is dropped is the newest of the consumers holding the most: each
// keeps its oldest requests up to a share found by water-filling, the
// budget the shares leave going to the requests just past them, oldest
// first. A flood drops its own requests, and a consumer within an equal
// share loses none.
func (b *backlog) trim(maxN int, maxBytes int64) {
	if b.n <= maxN && b.bytes <= maxBytes {
		return
	}
	b.counts, b.sizes = b.counts[:0], b.sizes[:0]
	for _, q := range b.turn {
		b.counts = append(b.counts, int64(q.len()))
		b.sizes = append(b.sizes, q.costTo(len(q.msgs)))
	}
	levelN, spareN := waterLevel(b.counts, int64(maxN))
	levelBytes, spareBytes := waterLevel(b.sizes, maxBytes)
	// Each consumer keeps, without the spare budget, its oldest requests
	// within both levels; past them, each request needs the spare, taken
	// in arrival order over all the consumers, and the first that does
	// not get it drops with every newer one of its consumer.
	b.cands = b.cands[:0]
	for _, q := range b.turn {
		// The requests whose cost to the end stays within levelBytes.
		k := sortSearch(q.len(), func(j int) bool { return q.costTo(q.head+j+1) > levelBytes })
		k = min(k, int(min(levelN, int64(q.len()))))
		q.keptN, q.keptBytes, q.at = k, q.costTo(q.head+k), q.head+k
		if q.at < len(q.msgs) {
			b.cands = append(b.cands, q)
		}
	}
	heap.Init(&b.cands)
	for len(b.cands) > 0 {
		q := b.cands[0]
		c := q.costTo(q.at+1) - q.costTo(q.at)
		overN, overBytes := int64(q.keptN) >= levelN, q.keptBytes+c > levelBytes
		if overN && spareN == 0 || overBytes && spareBytes < c {
			b.truncate(q, q.at) // may move q's slices (compact): q.at is stale, q leaves the heap
			heap.Pop(&b.cands)
			continue
		}
		if overN {
			spareN--
		}
		if overBytes {
			spareBytes -= c
		}
		q.keptN++
		q.keptBytes += c
		q.at++
		if q.at == len(q.msgs) {
			heap.Pop(&b.cands)
		} else {
			heap.Fix(&b.cands, 0)
		}
	}
	b.prune()
}

// sortSearch is sort.Search: the least j in [0, n) with f(j), else n.
func sortSearch(n int, f func(int) bool) int {
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if !f(m) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// candidates orders the consumers by the arrival of the request trim
// looks at next.
type candidates []*queue

func (c candidates) Len() int           { return len(c) }
func (c candidates) Less(i, j int) bool { return c[i].seqs[c[i].at] < c[j].seqs[c[j].at] }
func (c candidates) Swap(i, j int)      { c[i], c[j] = c[j], c[i] }
func (c *candidates) Push(x any)        { *c = append(*c, x.(*queue)) }
func (c *candidates) Pop() any {
	old := *c
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*c = old[:len(old)-1]
	return q
}

// list returns the waiting requests in arrival order (tests).
func (b *backlog) list() []xfer.Message {
	type one struct {
		seq uint64
		m   xfer.Message
	}
	var all []one
	for _, q := range b.turn {
		for i := q.head; i < len(q.msgs); i++ {
			all = append(all, one{q.seqs[i], q.msgs[i]})
		}
	}
	slices.SortFunc(all, func(a, b one) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]xfer.Message, len(all))
	for i, o := range all {
		out[i] = o.m
	}
	return out
}

// waterLevel returns the largest level such that the totals, each cut to
// it, sum to at most budget, and what of the budget they leave.
func waterLevel(totals []int64, budget int64) (level, spare int64) {
	lo, hi := int64(0), int64(0)
	for _, t := range totals {
		hi = max(hi, t)
	}
	for lo < hi { // the largest level within the budget, in [lo, hi]
		mid := lo + (hi-lo+1)/2
		var sum int64
		for _, t := range totals {
			sum += min(t, mid)
		}
		if sum <= budget {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	spare = budget
	for _, t := range totals {
		spare -= min(t, lo)
	}
	return lo, spare
}
