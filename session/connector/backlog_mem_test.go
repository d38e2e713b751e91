package connector

import (
	"fmt"
	"testing"

	"github.com/ecxfer/ecxfer/xfer"
)

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
