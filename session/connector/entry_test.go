package connector

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

// entryWorld is a world whose pool allocates from a consumer cache.
func entryWorld(t *testing.T, cfg PoolConfig, blocks int) (*world, *cache.EmbeddingCache) {
	t.Helper()
	cc := cache.NewEmbeddingCache(blocks)
	cfg.Cache = cc
	return newWorld(t, cfg), cc
}

func TestFetchEntry(t *testing.T) {
	w, cc := entryWorld(t, PoolConfig{}, 8)
	w.entry(t, "H", 2, true)
	e, _ := w.cache.Get("H")
	copy(w.pdata.Block(e.Blocks[0]), "first!!!")
	if _, err := w.pool.FetchEntry(addr, "H", 9, w.now.Add(time.Minute), w.now); err != nil { // 9 bytes: 2 blocks of 8
		t.Fatal(err)
	}
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 })
	d := r.Completed[0]
	got, ok := cc.Get("H")
	if !d.Held || !ok || !got.Ready || got.Pins != 1 || len(d.Blocks) != 2 || string(w.cdata.Block(d.Blocks[0])) != "first!!!" {
		t.Fatalf("done %+v, entry %+v", d, got)
	}
	// Held: the next allocations cannot evict it.
	if _, err := cc.Alloc("X", 7); !errors.Is(err, cache.ErrNoSpace) {
		t.Fatalf("Alloc over a held entry: %v", err)
	}
	// A second FetchEntry of a held entry is a hit: held again, no request.
	if _, err := w.pool.FetchEntry(addr, "H", 9, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	if r := w.step(time.Millisecond); len(r.Completed) != 1 || !r.Completed[0].Held || r.Completed[0].Latency != 0 {
		t.Fatalf("hit %+v", r)
	}
	if got, _ := cc.Get("H"); got.Pins != 2 || w.pool.Stats().Hits != 1 || w.prod.Stats().Requests != 1 {
		t.Fatalf("after the hit: %+v, %+v", got, w.pool.Stats())
	}
	cc.Unpin("H")
	cc.Unpin("H")
	// A failure gives the blocks back at once.
	if _, err := w.pool.FetchEntry(addr, "absent", 8, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	if r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Failed) > 0 }); r.Failed[0].BlocksHeld {
		t.Fatalf("%+v", r)
	}
	if _, ok := cc.Get("absent"); ok || cc.Stats().Free != 6 {
		t.Fatalf("the failed fetch's blocks were not given back: %+v", cc.Stats())
	}
	// Too large for the cache: nothing starts.
	if _, err := w.pool.FetchEntry(addr, "big", 100, w.now.Add(time.Minute), w.now); !errors.Is(err, cache.ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	if w.pool.InFlight() != 0 {
		t.Fatal("in flight")
	}
}

// Library-managed blocks under every way a fetch ends, at random: success,
// NACK, a READ that fails, cancel, deadline, a READ that may still write
// (released later), the producer's death, and Close. Checked at every
// step: no block is in two places at once (held by the engine, under a
// fetch, or waiting for its READ to end), and an entry the engine holds is
// never evicted; at the end, with the engine's entries let go, every block
// is free or in a ready, evictable entry.
func TestFetchEntryBlocksAtRandom(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { fetchEntryRandom(t, seed) })
	}
}

func fetchEntryRandom(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	w, cc := entryWorld(t, PoolConfig{AckTimeout: 50 * time.Millisecond,
		Xfer: xfer.Config{ReadTimeout: 40 * time.Millisecond, QuarantineTimeout: 80 * time.Millisecond}}, 24)
	w.cdata.SetStopsReads(seed%2 == 0)
	for i := range 12 {
		w.entry(t, fmt.Sprint("e", i), 1+i%3, i%5 != 0)
	}
	held := map[string][]int{} // entries the engine holds, and their blocks
	var retired map[int]bool
	check := func() {
		t.Helper()
		owner := map[int]string{}
		claim := func(b int, who string) {
			if o, ok := owner[b]; ok {
				t.Fatalf("seed %d: block %d is %s's and %s's", seed, b, o, who)
			}
			owner[b] = who
		}
		for h, bs := range held {
			e, ok := cc.Get(h)
			if !ok || !e.Ready || e.Pins == 0 {
				t.Fatalf("seed %d: held entry %s evicted or let go: %+v", seed, h, e)
			}
			for _, b := range bs {
				claim(b, "held "+h)
			}
		}
		for h, f := range w.pool.fetches {
			for _, b := range f.blocks {
				claim(b, "fetch "+h)
			}
		}
		for h, managed := range w.pool.held {
			if !managed {
				continue
			}
			e, ok := cc.Get(h)
			if !ok || e.Ready {
				t.Fatalf("seed %d: unsettled %s has no entry being written", seed, h)
			}
			for _, b := range e.Blocks {
				claim(b, "unsettled "+h)
			}
		}
		// No block a READ may still write is free, or another entry's.
		for b := range w.cdata.Blocks() {
			if !w.cdata.MayWrite(b) {
				continue
			}
			if o, ok := owner[b]; (!ok || strings.HasPrefix(o, "held ")) && !retired[b] {
				t.Fatalf("seed %d: block %d may still be written, and is %q", seed, b, o)
			}
		}
	}
	retired = map[int]bool{}
	take := func(r Results) {
		for _, rel := range r.Released {
			if rel.Forced {
				for _, b := range rel.Blocks {
					retired[b] = true
				}
			}
		}
		for _, d := range r.Completed {
			if _, dup := held[d.MMHash]; dup {
				cc.Unpin(d.MMHash) // held twice (a hit): let one go
				continue
			}
			held[d.MMHash] = d.Blocks
		}
	}
	for step := range 400 {
		switch rng.IntN(10) {
		case 0, 1, 2:
			h := fmt.Sprint("e", rng.IntN(14)) // e12, e13 are absent
			if rng.IntN(4) == 0 {
				w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: rng.IntN(2) == 0})
			} else if rng.IntN(6) == 0 {
				w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.FailAfter})
			}
			_, err := w.pool.FetchEntry(addr, h, 8*(1+rng.IntN(3)), w.now.Add(time.Duration(rng.IntN(100))*time.Millisecond), w.now)
			if err != nil && !errors.Is(err, cache.ErrNoSpace) && !errors.Is(err, ErrInFlight) && !errors.Is(err, ErrClosed) {
				t.Fatalf("seed %d: %v", seed, err)
			}
		case 3:
			if hs := slices.Sorted(maps.Keys(w.pool.fetches)); len(hs) > 0 {
				w.pool.Cancel(hs[rng.IntN(len(hs))], w.now)
			}
		case 4:
			if hs := slices.Sorted(maps.Keys(held)); len(hs) > 0 {
				h := hs[rng.IntN(len(hs))]
				cc.Unpin(h)
				delete(held, h)
			}
		case 5:
			if rng.IntN(4) == 0 {
				err := errClosed
				if rng.IntN(2) == 0 {
					err = xfer.ErrPeerSilent
				}
				w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: err})
			}
		case 6:
			for _, p := range w.cdata.Posts() {
				if rng.IntN(3) == 0 {
					w.cdata.Finish(p.Handle)
				}
			}
		}
		take(w.step(time.Duration(1+rng.IntN(10)) * time.Millisecond))
		check()
		if step == 300 && seed%3 == 0 {
			w.pool.Close()
		}
	}
	w.pool.Close()
	for _, p := range w.cdata.Posts() {
		w.cdata.Finish(p.Handle)
	}
	take(w.step(time.Millisecond))
	check()
	for h := range held {
		cc.Unpin(h)
	}
	st := cc.Stats()
	if st.Free+st.EvictableBlock+st.Retired != st.Capacity || st.NotReady != 0 || st.Pinned != 0 {
		t.Fatalf("seed %d: blocks lost: %+v", seed, st)
	}
}
