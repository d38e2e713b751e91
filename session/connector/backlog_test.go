package connector

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// A consumer left waiting is served within a round of the turn, however
// many consumers arrive after it: arrivals join the turn behind it.
func TestBacklogTakeDoesNotStarveAnOlderConsumer(t *testing.T) {
	const total, per = 1024, 64
	var b backlog
	seq := 0
	send := func(id string, k int) {
		for range k {
			seq++
			b.add(xfer.Message{Identity: []byte(id), At: time.Unix(0, int64(seq))})
		}
	}
	// A and C1..C16 wait with more than a step's share each: the first
	// take serves A and C1..C15 and leaves the turn at C16.
	send("A", 2*per)
	for i := range 16 {
		send(fmt.Sprint("C", i), 20*per)
	}
	b.take(nil, total, per)
	for step := range 50 {
		// Each step, 16 consumers arrive, each with one step's share: they
		// join the turn ahead of A.
		for i := range 16 {
			send(fmt.Sprint("G", step, "-", i), per)
		}
		for _, m := range b.take(nil, total, per) {
			if string(m.Identity) == "A" {
				return
			}
		}
	}
	t.Fatalf("A waited 50 steps with %d consumers waiting; a round takes %d", len(b.turn), (len(b.turn)*per+total-1)/total)
}

// checkBacklog checks b's bookkeeping against its queues.
func checkBacklog(t *testing.T, b *backlog, where string) {
	t.Helper()
	n, bytes := 0, int64(0)
	seen := map[*queue]bool{}
	for _, q := range b.turn {
		if seen[q] || b.queues[q.id] != q || q.len() <= 0 {
			t.Fatalf("%s: turn holds %q twice, unmapped or empty (len %d)", where, q.id, q.len())
		}
		seen[q] = true
		var c int64
		for i := q.head; i < len(q.msgs); i++ {
			c += cost(q.msgs[i])
			if q.costTo(i+1)-q.costTo(i) != cost(q.msgs[i]) || (i > q.head && q.seqs[i] <= q.seqs[i-1]) {
				t.Fatalf("%s: %q request %d: cum or seqs wrong", where, q.id, i)
			}
		}
		if q.costTo(len(q.msgs)) != c || len(q.seqs) != len(q.msgs) || len(q.cum) != len(q.msgs) {
			t.Fatalf("%s: %q costs %d, cum says %d", where, q.id, c, q.costTo(len(q.msgs)))
		}
		for i := range q.head { // taken: cleared, so they are not kept alive
			if q.msgs[i].Payload != nil || q.msgs[i].Identity != nil {
				t.Fatalf("%s: %q keeps taken request %d", where, q.id, i)
			}
		}
		for _, m := range q.msgs[len(q.msgs):cap(q.msgs)] {
			if m.Payload != nil || m.Identity != nil {
				t.Fatalf("%s: %q keeps a request past its length", where, q.id)
			}
		}
		n += q.len()
		bytes += c
	}
	if len(b.queues) != len(b.turn) || n != b.n || bytes != b.bytes {
		t.Fatalf("%s: %d queues for %d in turn; %d requests (%d bytes), counted %d (%d)",
			where, len(b.queues), len(b.turn), n, bytes, b.n, b.bytes)
	}
	if len(b.turn) > 0 && (b.next < 0 || b.next >= len(b.turn)) {
		t.Fatalf("%s: next %d of %d", where, b.next, len(b.turn))
	}
}

// Random arrivals, trims and takes, against a plain model: totals, each
// consumer's order, every request taken, dropped or waiting exactly once,
// trims as the plain rule's, takes using all they may, and every consumer
// waiting served within a round of the turn.
func TestBacklogInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	junk := make([]byte, 1<<20)
	for trial := range 100 {
		var b backlog
		maxN := 1 + rng.IntN(400)
		maxBytes := int64(backlogBytes)
		if rng.IntN(2) == 0 {
			maxBytes = int64(1 + rng.IntN(1<<22))
		}
		total, per := 1+rng.IntN(128), 1+rng.IntN(32)
		ids := 1 + rng.IntN(60)
		model := map[string][]int64{} // each consumer's waiting, by tag, oldest first
		fate := map[int64]byte{}      // 'w'aiting, 't'aken, 'd'ropped
		done := map[byte]int{}        // the settled, by fate
		tag := int64(0)
		type wait struct{ since, most int } // step it began waiting unserved; most consumers since
		waiting := map[string]*wait{}
		for step := range 60 {
			where := fmt.Sprintf("trial %d step %d", trial, step)
			burst := rng.IntN(3 * total)
			if rng.IntN(5) == 0 {
				burst = rng.IntN(2 * maxN)
			}
			for range burst {
				tag++
				id := fmt.Sprint("c", rng.IntN(ids)%(1+rng.IntN(ids)))
				size := rng.IntN(200)
				if rng.IntN(8) == 0 {
					size = rng.IntN(len(junk))
				}
				b.add(xfer.Message{Identity: []byte(id), Payload: junk[:size:size], At: time.Unix(0, tag)})
				model[id] = append(model[id], tag)
				fate[tag] = 'w'
			}
			checkBacklog(t, &b, where+" add")
			// trim: as the plain rule, the dropped each a consumer's newest
			want, wantDropped := trimFlat(b.list(), maxN, maxBytes)
			dropped := b.dropped
			b.trim(maxN, maxBytes)
			checkBacklog(t, &b, where+" trim")
			got := b.list()
			if len(got) != len(want) || int(b.dropped-dropped) != wantDropped {
				t.Fatalf("%s: trim kept %d, dropped %d; the rule %d, %d", where, len(got), b.dropped-dropped, len(want), wantDropped)
			}
			keep := map[string]int{}
			for i, m := range got {
				if m.At != want[i].At {
					t.Fatalf("%s: trim kept request %d unlike the rule", where, i)
				}
				keep[string(m.Identity)]++
			}
			for id, q := range model {
				for _, g := range q[keep[id]:] {
					fate[g] = 'd'
				}
				if model[id] = q[:keep[id]]; keep[id] == 0 {
					delete(model, id)
				}
			}
			if b.n > maxN || b.bytes > maxBytes {
				t.Fatalf("%s: %d requests (%d bytes) wait after trim", where, b.n, b.bytes)
			}
			// take
			could := 0
			for _, q := range model {
				could += min(per, len(q))
			}
			consumers := len(model)
			taken := b.take(nil, total, per)
			checkBacklog(t, &b, where+" take")
			if len(taken) != min(total, could) {
				t.Fatalf("%s: took %d of the %d it may", where, len(taken), min(total, could))
			}
			served := map[string]int{}
			for _, m := range taken {
				id, g := string(m.Identity), m.At.UnixNano()
				q := model[id]
				if len(q) == 0 || q[0] != g || fate[g] != 'w' { // a settled one is no longer in fate
					t.Fatalf("%s: took %s's %d out of order or not waiting (%c)", where, id, g, fate[g])
				}
				fate[g] = 't'
				if model[id] = q[1:]; len(q) == 1 {
					delete(model, id)
				}
				if served[id]++; served[id] > per {
					t.Fatalf("%s: took %d of %s", where, served[id], id)
				}
			}
			// fairness: a consumer waiting unserved is served within a round
			for id := range model {
				if served[id] > 0 || waiting[id] == nil {
					waiting[id] = &wait{since: step, most: consumers}
					if served[id] > 0 {
						continue
					}
				}
				w := waiting[id]
				w.most = max(w.most, consumers)
				if round := (w.most*min(per, total) + total - 1) / total; step-w.since+1 > round {
					t.Fatalf("%s: %s waited %d steps unserved; a round of %d consumers is %d", where, id, step-w.since+1, w.most, round)
				}
			}
			for id := range waiting {
				if model[id] == nil {
					delete(waiting, id)
				}
			}
			// each request once: its fate matches the model
			inModel := 0
			for _, q := range model {
				inModel += len(q)
				for _, g := range q {
					if fate[g] != 'w' {
						t.Fatalf("%s: %d waits, fate %c", where, g, fate[g])
					}
				}
			}
			nw := 0
			for g, f := range fate {
				if f == 'w' {
					nw++
					continue
				}
				delete(fate, g) // taken or dropped: settled, counted in done
				done[f]++
			}
			nd := done['d']
			if nw != inModel || nw != b.n || uint64(nd) != b.dropped || nw+nd+done['t'] != int(tag) {
				t.Fatalf("%s: %d waiting (model %d, counted %d), %d dropped (counted %d)", where, nw, inModel, b.n, nd, b.dropped)
			}
		}
	}
}

// trimFlat is the backlog's trim over one slice in arrival order, walking
// every request: the rule written plainly, against which the queues'
// trim, which walks only what it drops, is checked.
func trimFlat(msgs []xfer.Message, maxN int, maxBytes int64) (kept []xfer.Message, dropped int) {
	type waiting struct {
		n, bytes int64
		full     bool
	}
	per := map[string]*waiting{}
	var size int64
	for _, m := range msgs {
		size += cost(m)
	}
	if len(msgs) <= maxN && size <= maxBytes {
		return msgs, 0
	}
	var order []string
	for _, m := range msgs {
		h := per[string(m.Identity)]
		if h == nil {
			h = &waiting{}
			per[string(m.Identity)] = h
			order = append(order, string(m.Identity))
		}
		h.n++
		h.bytes += cost(m)
	}
	var counts, sizes []int64
	for _, id := range order {
		counts = append(counts, per[id].n)
		sizes = append(sizes, per[id].bytes)
		*per[id] = waiting{}
	}
	levelN, spareN := waterLevel(counts, int64(maxN))
	levelBytes, spareBytes := waterLevel(sizes, maxBytes)
	for _, m := range msgs {
		h := per[string(m.Identity)]
		c := cost(m)
		overN, overBytes := h.n >= levelN, h.bytes+c > levelBytes
		switch {
		case h.full:
		case overN && spareN == 0, overBytes && spareBytes < c:
			h.full = true
		default:
			if overN {
				spareN--
			}
			if overBytes {
				spareBytes -= c
			}
			h.n++
			h.bytes += c
			kept = append(kept, m)
		}
		if h.full {
			dropped++
		}
	}
	return kept, dropped
}

// The backlog's slices hold about what a flood brings in one step, not
// that for every consumer that flooded once and still has a request waiting.
func TestBacklogCapacityFollowsWhatWaits(t *testing.T) {
	const maxN, burst, total, per = 16384, 16384, 1024, 64
	var b backlog
	id := []byte("x")
	for step := range 64 {
		// a new identity floods once; those that did keep a few waiting
		for range burst {
			b.add(xfer.Message{Identity: fmt.Append(nil, "F", step)})
		}
		for j := range step {
			for range 32 {
				b.add(xfer.Message{Identity: fmt.Append(id[:0], "F", j)})
			}
		}
		b.trim(maxN, backlogBytes)
		b.take(nil, total, per)
	}
	slots := 0
	for _, q := range b.turn {
		slots += cap(q.msgs)
	}
	t.Logf("%d consumers, %d requests waiting, %d slots (%d MiB) held", len(b.turn), b.n, slots, slots*88>>20)
	if slots > 4*(maxN+burst) {
		t.Fatalf("%d slots held for %d requests waiting; a step brings at most %d", slots, b.n, maxN+burst)
	}
}
