package session

import (
	"fmt"
	"testing"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

// BenchmarkRefusedRead is the check of a 33-block READ under a live grant,
// refused (its first block is not the grant's), by the grant's entry size
// (scattered blocks): a READ a peer can repeat costs what its own ids
// take to search, not a pass over the entry.
func BenchmarkRefusedRead(b *testing.B) {
	for _, n := range []int{256, 16384} {
		b.Run(fmt.Sprint("entry=", n), func(b *testing.B) {
			c := cache.NewEmbeddingCache(2 * n)
			for i := range n { // every other block taken by a small entry first
				c.Alloc(fmt.Sprint("pad", i), 1)
				c.Alloc(fmt.Sprint("gap", i), 1)
			}
			for i := range n {
				c.Discard(fmt.Sprint("gap", i))
			}
			e, err := c.Alloc("big", n)
			if err != nil {
				b.Fatal(err)
			}
			c.MarkReady("big")
			p := must(NewProducerSession(ProducerConfig{Logger: quiet, MaxPinnedShare: 1}, xfake.New("prod", 2*n, 8), c, compat))
			p.Poll([]xfer.Message{{Identity: []byte("c"), Payload: req("big", sid("a"))}}, &queue{}, t0)
			in := map[int]bool{}
			for _, id := range e.Blocks {
				in[id] = true
			}
			want := make([]int, 0, 33)
			for id := 0; len(want) == 0; id++ { // a block not the grant's
				if !in[id] {
					want = append(want, id)
				}
			}
			want = append(want, e.Blocks[:32]...)
			notif := []byte(sid("a") + ":big")
			for b.Loop() {
				if _, ok := p.authorizeRelease("cons", notif, want); ok {
					b.Fatal("granted")
				}
			}
		})
	}
}
