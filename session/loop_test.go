package session

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

// A consumer and a producer talk through in-memory queues for a few hundred
// transfers with random NACKs and DMA delays. Every completed fetch holds
// the producer's bytes; at the end no pin, grant, handle or peer is left.
func TestConsumerProducerLoop(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	const blockSize = 16
	fab := xfake.NewFabric()
	cdata, pdata := fab.New("cons", 48, blockSize), fab.New("prod", 128, blockSize)
	pc := cache.NewEmbeddingCache(128)

	// 60 entries of 1..3 blocks; a third of them not ready at first.
	keys := make([]string, 60)
	notReady := map[string]bool{}
	for i := range keys {
		keys[i] = fmt.Sprintf("entry-%02d", i)
		e, err := pc.Alloc(keys[i], 1+i%3)
		if err != nil {
			t.Fatal(err)
		}
		for j, b := range e.Blocks {
			copy(pdata.Block(b), fmt.Sprintf("%s/%d/%s", keys[i], j, "................"))
		}
		if i%3 == 0 {
			notReady[keys[i]] = true
		} else if err := pc.MarkReady(keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	toP, toC := &queue{}, &queue{}
	cons, err := NewConsumerSession(ConsumerConfig{Logger: quiet, Rand: newSeeded(3)}, toP, cdata, compat)
	if err != nil {
		t.Fatal(err)
	}
	prod := must(NewProducerSession(ProducerConfig{Logger: quiet}, pdata, pc, compat))

	free := make([]int, 48)
	for i := range free {
		free[i] = i
	}
	want := map[string]int{} // fetches left per key
	var order []string
	for range 300 {
		k := keys[rng.IntN(len(keys))]
		if rng.IntN(10) == 0 {
			k = "absent-" + k // NACK_MISSING
		}
		want[k]++
		order = append(order, k)
	}
	completed, nacked := 0, 0
	now := t0
	var r Results
	for step := 0; step < 5000 && (len(order) > 0 || cons.InFlight() > 0); step++ {
		now = now.Add(100 * time.Millisecond)
		// Start what fits, skipping keys already in flight.
		for i := 0; i < len(order) && i < 8; i++ {
			k := order[i]
			n := 1
			if e, ok := pc.Get(k); ok {
				n = len(e.Blocks)
			}
			if len(free) < n {
				break
			}
			blocks := slices.Clone(free[len(free)-n:])
			if err := cons.StartXfer(k, blocks, now.Add(2*time.Second), now); err != nil {
				continue // in flight: try later
			}
			free = free[:len(free)-n]
			order = slices.Delete(order, i, i+1)
			i--
			cdata.QueueOutcomes(xfake.Outcome{After: rng.IntN(6)})
		}
		// Deliver in random batches: some steps the producer runs late.
		if rng.IntN(4) != 0 {
			var in []xfer.Message
			for _, m := range toP.take() {
				in = append(in, xfer.Message{Identity: []byte("c"), Payload: m})
			}
			prod.Poll(in, toC, now)
		}
		cons.Poll(toC.take(), now)
		r.Reset()
		cons.TakeResults(&r)
		for _, o := range r.Completed {
			e, _ := pc.Get(o.MMHash)
			for j, b := range o.Blocks {
				if !bytes.Equal(cdata.Block(b), pdata.Block(e.Blocks[j])) {
					t.Fatalf("%s block %d: got %q", o.MMHash, j, cdata.Block(b))
				}
			}
			completed++
			free = append(free, o.Blocks...)
		}
		for _, o := range r.tombstoned() {
			nacked++
			free = append(free, o.Blocks...)
		}
		for _, o := range r.retryable() {
			order = append(order, o.MMHash) // ask again later
			free = append(free, o.Blocks...)
		}
		if len(r.quarantined()) > 0 || len(r.settled()) > 0 {
			t.Fatalf("unexpected quarantine: %+v", r)
		}
		// Saves land over time.
		for k := range notReady {
			if rng.IntN(20) == 0 {
				if err := pc.MarkReady(k); err != nil {
					t.Fatal(err)
				}
				delete(notReady, k)
			}
		}
	}
	if len(order) > 0 || cons.InFlight() > 0 {
		t.Fatalf("did not finish: %d left, in flight %v", len(order), cons.InFlight() > 0)
	}
	if completed+nacked != 300 || completed < 200 {
		t.Fatalf("completed %d, tombstoned %d", completed, nacked)
	}
	// Drain the last notifications, then nothing may be held.
	prod.Poll(nil, toC, now)
	if st := pc.Stats(); st.Pinned != 0 || prod.Grants() != 0 {
		t.Fatalf("pins left: %+v, grants %d", st, prod.Grants())
	}
	if s := prod.Stats(); s.Nacks[5] == 0 || s.Nacks[1] == 0 || s.Completions == 0 {
		t.Fatalf("the run did not exercise NACKs and completions: %+v", s)
	}
	if err := cons.Close(); err != nil {
		t.Fatal(err)
	}
	var rep Results
	cons.TakeResults(&rep)
	if rep.Len() != 0 {
		t.Fatalf("close found transfers: %+v", rep)
	}
	cdata.CheckNoLeaks(t)
	pdata.CheckNoLeaks(t)
	if len(free) != 48 {
		t.Fatalf("%d of 48 local blocks back", len(free))
	}
}
