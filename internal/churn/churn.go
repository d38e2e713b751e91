// Package churn uses an EmbeddingCache the way an encoder's cache is used
// for long, for benchmarks of where its blocks end up: images of mixed
// sizes, each new or, drawn Zipf-like from a fixed set, seen before.
package churn

import (
	"fmt"
	"math/rand/v2"

	"github.com/ecxfer/ecxfer/cache"
)

// Sizes are the images' rows, one 8 KiB block each: 576 is LLaVA-1.5's
// image, the others as a dynamic-resolution encoder's would vary.
var Sizes = []int{576, 1024, 256, 144, 729, 2304}

// Workload asks a cache for images.
type Workload struct {
	c    *cache.EmbeddingCache
	rng  *rand.Rand
	zipf *rand.Zipf // nil: every image is new
	next uint64
}

// New returns a workload on c; images 0 asks for a new one each time,
// else images are drawn from that many, the most popular most often.
func New(c *cache.EmbeddingCache, seed, images uint64) *Workload {
	w := &Workload{c: c, rng: rand.New(rand.NewPCG(seed, 1))}
	if images > 0 {
		w.zipf = rand.NewZipf(w.rng, 1.1, 1, images-1)
	}
	return w
}

// Next asks for one image: a hit pins and unpins it (a reader took it);
// a miss allocates it and marks it ready, and returns its entry.
func (w *Workload) Next() (e cache.Entry, miss bool, err error) {
	id := w.next
	if w.zipf != nil {
		id = w.zipf.Uint64()
	} else {
		w.next++
	}
	key := fmt.Sprint("img-", id)
	if _, err := w.c.Pin(key); err == nil {
		return cache.Entry{}, false, w.c.Unpin(key)
	}
	size := Sizes[(id*0x9e3779b97f4a7c15>>32)%uint64(len(Sizes))] // the image's own, as if hashed
	if e, err = w.c.Alloc(key, size); err != nil {
		return e, true, err
	}
	return e, true, w.c.MarkReady(key)
}
