package connector

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

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

// The queues' trim keeps exactly what the plain rule keeps, over random
// backlogs built and taken from across many steps.
func TestBacklogTrimMatchesThePlainRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	junk := make([]byte, 1<<20)
	arrived := 0
	for trial := range 300 {
		var b backlog
		maxN := 1 + rng.IntN(300)
		maxBytes := int64(backlogBytes)
		if rng.IntN(2) == 0 {
			maxBytes = int64(1 + rng.IntN(1<<22))
		}
		ids := 1 + rng.IntN(50)
		for step := range 1 + rng.IntN(6) {
			for range rng.IntN(2 * maxN) {
				arrived++
				size := 1 + rng.IntN(200)
				if rng.IntN(4) == 0 {
					size = 1 + rng.IntN(len(junk))
				}
				b.add(xfer.Message{Identity: fmt.Append(nil, "c", rng.IntN(ids)%(1+rng.IntN(ids))), Payload: junk[:size],
					At: time.Unix(int64(arrived), 0)})
			}
			before := b.list()
			droppedBefore := b.dropped
			want, wantDropped := trimFlat(before, maxN, maxBytes)
			b.trim(maxN, maxBytes)
			got := b.list()
			if len(got) != len(want) || int(b.dropped-droppedBefore) != wantDropped {
				t.Fatalf("trial %d step %d: kept %d (dropped %d), the rule keeps %d (drops %d)",
					trial, step, len(got), b.dropped-droppedBefore, len(want), wantDropped)
			}
			for i := range got {
				if got[i].At != want[i].At {
					t.Fatalf("trial %d step %d: request %d differs from the rule's", trial, step, i)
				}
			}
			b.take(nil, rng.IntN(maxN+1), 1+rng.IntN(64))
		}
	}
}
