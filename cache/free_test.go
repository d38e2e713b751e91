package cache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// runsIn counts the runs of consecutive ids in ascending blocks.
func runsIn(blocks []int) int {
	n := 0
	for i, b := range blocks {
		if i == 0 || b != blocks[i-1]+1 {
			n++
		}
	}
	return n
}

// checkBlocks fails unless every block not retired is either free or one
// entry's, never both, and the free runs are maximal, disjoint and indexed.
func checkBlocks(t *testing.T, c *EmbeddingCache) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	owner := make([]string, c.capacity)
	own := func(b int, who string) {
		if b < 0 || b >= c.capacity || owner[b] != "" {
			t.Fatalf("block %d: %s, and %q", b, who, owner[b])
		}
		owner[b] = who
	}
	held := 0
	for k, e := range c.entries {
		if !slices.IsSorted(e.blocks) {
			t.Fatalf("%s: blocks %v not ascending", k, e.blocks)
		}
		for _, b := range e.blocks {
			own(b, "entry "+k)
		}
		held += len(e.blocks)
	}
	f, free, runs := c.free, 0, 0
	for n, s := range f.bySize {
		if len(s) == 0 || !slices.Contains(f.sizes, n) {
			t.Fatalf("length %d: %d runs, sizes %v", n, len(s), f.sizes)
		}
		for at, i := range s {
			r := f.runs[i]
			if r.n != n || r.at != at || f.first[r.start] != i+1 || f.last[r.start+r.n-1] != i+1 {
				t.Fatalf("run %d %+v indexed wrong", i, r)
			}
			if r.start > 0 && f.last[r.start-1] != 0 || r.start+r.n < c.capacity && f.first[r.start+r.n] != 0 {
				t.Fatalf("run %+v has a free neighbour: not merged", r)
			}
			for b := r.start; b < r.start+r.n; b++ {
				own(b, "free")
			}
			free += r.n
			runs++
		}
	}
	ends := 0
	for id := range c.capacity {
		if f.first[id] != 0 {
			ends++
		}
		if f.last[id] != 0 {
			ends++
		}
	}
	if ends != 2*runs || len(f.sizes) != len(f.bySize) || !slices.IsSorted(f.sizes) || runs+len(f.spare) != len(f.runs) {
		t.Fatalf("%d runs, %d ends marked, %d spare of %d; sizes %v", runs, ends, len(f.spare), len(f.runs), f.sizes)
	}
	if free != f.n || free+held+c.retired != c.capacity {
		t.Fatalf("%d free (counted %d), %d held, %d retired, capacity %d", free, f.n, held, c.retired, c.capacity)
	}
}

// Under any sequence of the cache's calls every block stays accounted for
// (free, one entry's, or retired). An entry comes in more than one run
// only when no free run could hold it and eviction
// could not make one cheaply: no free run is left that holds it, and its
// limit was free, or nothing more was evictable, or the next oldest was
// over the limit or held no blocks.
func TestBlocksAccountedAndEntriesInFewRuns(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		c := NewEmbeddingCache(512)
		var keys []string
		split := 0
		for i := range 3000 {
			k := fmt.Sprint(i % 97)
			switch op := rng.IntN(10); {
			case op < 4:
				n := rng.IntN(40)
				if rng.IntN(8) == 0 {
					n = rng.IntN(200)
				}
				e, err := c.Alloc(k, n)
				if err != nil {
					break
				}
				keys = append(keys, k)
				c.mu.Lock()
				// How much eviction for a run frees is checked exactly
				// against a model in TestCacheModel.
				limit, next := min(4*n, c.capacity/16), c.lru.next
				if runsIn(e.Blocks) > 1 {
					split++
					if c.free.holds(n) || c.free.n+n < limit && next != &c.lru && len(next.blocks) > 0 && len(next.blocks) <= limit {
						t.Fatalf("seed %d: %d blocks in %d runs, %d free in runs %v, evictable %d",
							seed, n, runsIn(e.Blocks), c.free.n, c.free.sizes, c.evictable)
					}
				}
				c.mu.Unlock()
			case op < 6:
				c.MarkReady(k)
			case op < 7:
				if _, err := c.Pin(k); err == nil && rng.IntN(4) > 0 {
					c.Unpin(k)
				}
			case op < 8:
				c.Unpin(k)
			case op < 9:
				c.Remove(k)
			default:
				if rng.IntN(4) == 0 {
					c.Retire(k)
				} else {
					c.Discard(k)
				}
			}
			checkBlocks(t, c)
		}
		if len(keys) == 0 || split == 0 {
			t.Fatalf("seed %d: %d allocs, %d in several runs: the case is not exercised", seed, len(keys), split)
		}
	}
}

// The oldest entries go, beyond the blocks needed, while that makes a run
// that holds the new entry: here the third oldest, whose blocks join the
// second's. A free list that hands out what was freed last would have
// given blocks of the two oldest, in two runs.
func TestAllocEvictsForOneRun(t *testing.T) {
	c := NewEmbeddingCache(128) // Alloc's limit for 4 blocks: 8 free
	keys := []string{"a", "b", "c", "d"}
	for i := range 60 {
		keys = append(keys, fmt.Sprint(i))
	}
	for i, k := range keys {
		if e := mustAlloc(t, c, k, 2); e.Blocks[0] != 2*i {
			t.Fatalf("%s: blocks %v", k, e.Blocks)
		}
		mustReady(t, c, k)
	}
	if _, err := c.Pin("b"); err != nil { // b becomes the newest
		t.Fatal(err)
	}
	c.Unpin("b")
	e := mustAlloc(t, c, "e", 4)
	if !slices.Equal(e.Blocks, []int{4, 5, 6, 7}) {
		t.Fatalf("e: blocks %v, want 4-7 (c and d evicted after a)", e.Blocks)
	}
	if has(c, "a") || has(c, "c") || has(c, "d") || !has(c, "b") || !has(c, "0") || c.Stats().Free != 2 {
		t.Fatalf("b and 0 kept, a, c, d evicted: stats %+v", c.Stats())
	}
	// Nothing more to evict: the entry takes what there is, in two runs.
	mustReady(t, c, "e")
	for _, k := range keys {
		c.Pin(k)
	}
	c.Pin("e")
	if _, err := c.Alloc("f", 3); err == nil {
		t.Fatal("3 blocks from 2 free and nothing evictable")
	}
	c.Unpin("0") // blocks 8 and 9: no run of 3 can be made
	f := mustAlloc(t, c, "f", 3)
	if runsIn(f.Blocks) != 2 || !slices.Equal(f.Blocks[:2], []int{0, 1}) && !slices.Equal(f.Blocks[1:], []int{8, 9}) {
		t.Fatalf("f: blocks %v, want 3 of 0, 1, 8, 9", f.Blocks)
	}
	checkBlocks(t, c)
}

// Free blocks that hold no run of the entry are not enough: the oldest
// go while that makes one, up to the limit. An entry over the limit, or
// of no blocks (it frees nothing), does not go for a run.
func TestAllocEvictsForARunOnlyWithinItsLimit(t *testing.T) {
	c := NewEmbeddingCache(64) // limit for 2 blocks: 4 free
	for i := range 64 {
		mustAlloc(t, c, fmt.Sprint(i), 1)
		mustReady(t, c, fmt.Sprint(i))
	}
	c.Remove("10")
	c.Remove("20")
	if e := mustAlloc(t, c, "x", 2); !slices.Equal(e.Blocks, []int{0, 1}) || c.Stats().Evictions != 2 || !has(c, "2") {
		t.Fatalf("x: blocks %v, %d evicted: the two oldest were to go", e.Blocks, c.Stats().Evictions)
	}

	c = NewEmbeddingCache(1024) // limit for 4 blocks: 16 free
	for _, k := range []string{"a", "s", "b"} {
		mustAlloc(t, c, k, 1) // blocks 0, 1, 2
	}
	mustAlloc(t, c, "big", 900) // 3-902
	for i := range 121 {
		mustAlloc(t, c, fmt.Sprint(i), 1) // 903-1023
	}
	mustReady(t, c, "s", "big")
	for _, k := range []string{"10", "20", "30"} {
		if err := c.Discard(k); err != nil {
			t.Fatal(err)
		}
	}
	// s goes, for the 4 blocks needed; big would leave 904 free.
	if e := mustAlloc(t, c, "x", 4); !slices.Equal(e.Blocks, []int{1, 913, 923, 933}) || !has(c, "big") {
		t.Fatalf("x: blocks %v, big kept %v: only s was to go", e.Blocks, has(c, "big"))
	}
	checkBlocks(t, c)

	c = NewEmbeddingCache(64)
	mustAlloc(t, c, "empty", 0)
	for i := range 64 {
		mustAlloc(t, c, fmt.Sprint(i), 1)
	}
	mustReady(t, c, "empty", "1")
	c.Discard("10")
	c.Discard("20") // 2 free, in no run of 2; the oldest holds none
	if e := mustAlloc(t, c, "x", 2); runsIn(e.Blocks) != 2 || !has(c, "empty") || !has(c, "1") {
		t.Fatalf("x: blocks %v, empty kept %v, 1 kept %v: nothing was to go", e.Blocks, has(c, "empty"), has(c, "1"))
	}
	checkBlocks(t, c)
}
