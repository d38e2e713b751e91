package cache

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ecxfer/ecxfer/internal/cachex"
)

// modelRuns lists the maximal runs of a free set, ascending: [start, n].
func modelRuns(free []bool) [][2]int {
	var rs [][2]int
	for i := 0; i < len(free); {
		if !free[i] {
			i++
			continue
		}
		j := i
		for j < len(free) && free[j] {
			j++
		}
		rs = append(rs, [2]int{i, j - i})
		i = j
	}
	return rs
}

// checkFreeRuns fails unless f holds exactly the free blocks of the model,
// as maximal runs, with every index consistent: each slot is either in
// spare once or in bySize once, first/last marked exactly at run ends,
// sizes = sorted keys of bySize, at = position in bySize.
func checkFreeRuns(t *testing.T, f *freeRuns, free []bool) {
	t.Helper()
	want := modelRuns(free)
	nfree := 0
	for _, r := range want {
		nfree += r[1]
	}
	if f.n != nfree {
		t.Fatalf("f.n %d, model %d", f.n, nfree)
	}
	if len(f.first) != len(free) || len(f.last) != len(free) {
		t.Fatalf("tables %d/%d, capacity %d", len(f.first), len(f.last), len(free))
	}
	seen := make([]int, len(f.runs)) // 1: spare, 2: linked
	for _, i := range f.spare {
		if i < 0 || int(i) >= len(f.runs) || seen[i] != 0 {
			t.Fatalf("spare %v: slot %d bad or repeated", f.spare, i)
		}
		seen[i] = 1
	}
	var got [][2]int
	keys := make([]int, 0, len(f.bySize))
	for n, s := range f.bySize {
		keys = append(keys, n)
		if len(s) == 0 || n <= 0 {
			t.Fatalf("bySize[%d] = %v", n, s)
		}
		for at, i := range s {
			if i < 0 || int(i) >= len(f.runs) || seen[i] != 0 {
				t.Fatalf("bySize[%d] slot %d: spare or repeated (%d)", n, i, seen[i])
			}
			seen[i] = 2
			r := f.runs[i]
			if r.n != n || r.at != at {
				t.Fatalf("slot %d %+v in bySize[%d] at %d", i, r, n, at)
			}
			got = append(got, [2]int{r.start, r.n})
		}
	}
	for i, s := range seen {
		if s == 0 {
			t.Fatalf("slot %d neither spare nor linked", i)
		}
	}
	slices.Sort(keys)
	if !slices.Equal(keys, f.sizes) {
		t.Fatalf("sizes %v, bySize keys %v", f.sizes, keys)
	}
	slices.SortFunc(got, func(a, b [2]int) int { return a[0] - b[0] })
	if !slices.Equal(got, want) {
		t.Fatalf("runs %v, model %v", got, want)
	}
	marks := map[int][2]int32{}
	for _, r := range got {
		i := f.first[r[0]]
		if i == 0 || f.last[r[0]+r[1]-1] != i || f.runs[i-1].start != r[0] {
			t.Fatalf("run %v: first %d last %d", r, i, f.last[r[0]+r[1]-1])
		}
		marks[r[0]] = [2]int32{i, marks[r[0]][1]}
		e := r[0] + r[1] - 1
		marks[e] = [2]int32{marks[e][0], i}
	}
	for id := range free {
		m := marks[id]
		if f.first[id] != m[0] || f.last[id] != m[1] {
			t.Fatalf("id %d: first %d last %d, want %d %d", id, f.first[id], f.last[id], m[0], m[1])
		}
	}
}

// checkTake: got is n blocks that were free, ascending, in as few runs as
// the runs before allowed; in one run, it is the start of a shortest run
// that holds n.
func checkTake(t *testing.T, before [][2]int, got []int, n int) {
	t.Helper()
	if len(got) != n || !slices.IsSorted(got) {
		t.Fatalf("take %d: %v", n, got)
	}
	if n == 0 {
		return
	}
	best := -1
	for _, r := range before {
		if r[1] >= n && (best < 0 || r[1] < best) {
			best = r[1]
		}
	}
	if best >= 0 {
		if runsIn(got) != 1 {
			t.Fatalf("take %d from %v: %v in %d runs", n, before, got, runsIn(got))
		}
		for _, r := range before {
			if r[0] == got[0] {
				if r[1] != best {
					t.Fatalf("take %d from %v: run %v, shortest holding is %d", n, before, r, best)
				}
				return
			}
		}
		t.Fatalf("take %d from %v: %v starts no run", n, before, got)
	}
	lens := make([]int, 0, len(before))
	for _, r := range before {
		lens = append(lens, r[1])
	}
	slices.Sort(lens)
	k, sum := 0, 0
	for i := len(lens) - 1; i >= 0 && sum < n; i-- {
		sum += lens[i]
		k++
	}
	if runsIn(got) != k {
		t.Fatalf("take %d from %v: %v in %d runs, %d would do", n, before, got, runsIn(got), k)
	}
}

// allFree is the model of a new cache's blocks: every one free.
func allFree(capacity int) []bool {
	free := make([]bool, capacity)
	for i := range free {
		free[i] = true
	}
	return free
}

// countFree counts the model's free blocks.
func countFree(free []bool) int {
	n := 0
	for _, fr := range free {
		if fr {
			n++
		}
	}
	return n
}

var seedsFlag = flag.Int("model.seeds", 0, "seeds the model tests run (0: their default)")

func modelSeeds(def int) int {
	if *seedsFlag > 0 {
		return *seedsFlag
	}
	return def
}

// freeRuns against a set of booleans under random take and release of
// arbitrary subsets of the blocks in use (adjacent runs, ids 0 and
// capacity-1, single blocks, everything).
func TestFreeRunsModel(t *testing.T) {
	caps := []int{0, 1, 2, 3, 7, 15, 16, 17, 64, 200}
	for seed := range uint64(modelSeeds(40)) {
		for _, capacity := range caps {
			rng := rand.New(rand.NewPCG(seed, uint64(capacity)))
			f := newFreeRuns(capacity)
			free := allFree(capacity)
			checkFreeRuns(t, f, free)
			for range 400 {
				if rng.IntN(2) == 0 && f.n > 0 || f.n == capacity {
					n := 0
					switch rng.IntN(4) {
					case 0:
						n = f.n
					case 1:
						n = min(f.n, 1+rng.IntN(3))
					default:
						n = rng.IntN(f.n + 1)
					}
					if f.n == 0 {
						n = 0
					}
					before := modelRuns(free)
					got := f.take(nil, n)
					for _, b := range got {
						if b < 0 || b >= capacity || !free[b] {
							t.Fatalf("cap %d seed %d: took %d, not free", capacity, seed, b)
						}
						free[b] = false
					}
					checkTake(t, before, got, n)
				} else {
					var used []int
					for i, fr := range free {
						if !fr {
							used = append(used, i)
						}
					}
					var rel []int
					switch rng.IntN(5) {
					case 0:
						rel = used
					case 1: // a few runs of used, adjacent ones included
						for i := 0; i < len(used); {
							k := 1 + rng.IntN(4)
							if rng.IntN(2) == 0 {
								rel = append(rel, used[i:min(i+k, len(used))]...)
							}
							i += k
						}
					case 2:
						if len(used) > 0 {
							rel = []int{used[rng.IntN(len(used))]}
						}
					case 3: // ends of the cache
						for _, b := range used {
							if b == 0 || b == capacity-1 || b == 1 || b == capacity-2 {
								rel = append(rel, b)
							}
						}
					default:
						for _, b := range used {
							if rng.IntN(3) == 0 {
								rel = append(rel, b)
							}
						}
					}
					f.release(rel)
					for _, b := range rel {
						free[b] = true
					}
				}
				checkFreeRuns(t, f, free)
			}
		}
	}
}

// The cache against a model: which entries exist, their state, and the
// order of the evictable ones. Each Alloc must evict exactly what the
// documented rule says, never a pinned or not-ready entry, and hand out
// blocks that were free after it; Stats and pressure agree with the model.
func TestCacheModel(t *testing.T) {
	type ment struct {
		blocks []int
		ready  bool
		pins   int
	}
	caps := []int{0, 1, 2, 15, 16, 17, 33, 64, 130, 512}
	forRun, split, allocs := 0, 0, 0
	defer func() { t.Logf("%d allocs, %d evicted for a run, %d in several runs", allocs, forRun, split) }()
	for seed := range uint64(modelSeeds(30)) {
		for _, capacity := range caps {
			rng := rand.New(rand.NewPCG(seed, 1000+uint64(capacity)))
			c := NewEmbeddingCache(capacity)
			ents := map[string]*ment{}
			var lru []string // evictable, oldest first
			retired, evictions, maxSave := 0, uint64(0), 0
			free := allFree(capacity)
			drop := func(k string) {
				if i := slices.Index(lru, k); i >= 0 {
					lru = slices.Delete(lru, i, i+1)
				}
			}
			release := func(blocks []int) {
				for _, b := range blocks {
					free[b] = true
				}
			}
			nkeys := 40 + int(seed%3)*40
			for step := range 1500 {
				k := fmt.Sprint(rng.IntN(nkeys))
				e, exists := ents[k]
				op := rng.IntN(12)
				switch {
				case op < 4:
					var n int
					switch rng.IntN(8) {
					case 6, 7: // small: a run may be evicted for
						n = 1 + rng.IntN(max(capacity/40, 1))
					case 0:
						n = 0
					case 1:
						n = capacity
					case 2:
						n = rng.IntN(capacity + 2)
					default:
						n = rng.IntN(max(capacity/8, 1) + 1)
					}
					if rng.IntN(50) == 0 {
						n = -1
					}
					// The reference: evict what is needed, then the rule.
					nfree := countFree(free)
					evictable := 0
					for _, x := range lru {
						evictable += len(ents[x].blocks)
					}
					got, err := c.Alloc(k, n)
					switch {
					case exists:
						if !errors.Is(err, ErrDuplicate) {
							t.Fatalf("dup alloc %q: %v", k, err)
						}
						continue
					case n < 0 || n > capacity:
						if !errors.Is(err, ErrTooLarge) {
							t.Fatalf("alloc %d of %d: %v", n, capacity, err)
						}
						continue
					}
					maxSave = max(maxSave, n)
					if nfree+evictable < n {
						if !errors.Is(err, ErrNoSpace) {
							t.Fatalf("alloc %d, %d free %d evictable: %v", n, nfree, evictable, err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("seed %d cap %d step %d: alloc %d: %v", seed, capacity, step, n, err)
					}
					var gone []string
					evictOldest := func() {
						x := lru[0]
						lru = lru[1:]
						gone = append(gone, x)
						release(ents[x].blocks)
						nfree += len(ents[x].blocks)
						delete(ents, x)
					}
					for nfree < n {
						evictOldest()
					}
					needed, afterNeeded := len(gone), nfree
					limit := min(4*n, capacity/16)
					holds := func() bool {
						for _, r := range modelRuns(free) {
							if r[1] >= n {
								return true
							}
						}
						return false
					}
					for !holds() && nfree < limit && len(lru) > 0 && len(ents[lru[0]].blocks) > 0 && len(ents[lru[0]].blocks) <= limit {
						evictOldest()
					}
					if len(gone) > needed && (nfree >= 2*limit || nfree-afterNeeded >= 2*limit) {
						t.Fatalf("seed %d cap %d step %d: %d free after evicting for a run of %d, limit %d", seed, capacity, step, nfree, n, limit)
					}
					evictions += uint64(len(gone))
					allocs++
					if len(gone) > needed {
						forRun++
					}
					if runsIn(got.Blocks) > 1 {
						split++
					}
					for _, x := range gone {
						if has(c, x) {
							t.Fatalf("seed %d cap %d step %d: %q should have been evicted", seed, capacity, step, x)
						}
					}
					before := modelRuns(free)
					for _, b := range got.Blocks {
						if b < 0 || b >= capacity || !free[b] {
							t.Fatalf("seed %d cap %d step %d: block %d not free", seed, capacity, step, b)
						}
						free[b] = false
					}
					checkTake(t, before, got.Blocks, n)
					ents[k] = &ment{blocks: got.Blocks}
					if seed%2 == 1 && rng.IntN(4) > 0 { // ready at once: more to evict
						if err := c.MarkReady(k); err != nil {
							t.Fatal(err)
						}
						ents[k].ready = true
						lru = append(lru, k)
					}
				case op < 6:
					err := c.MarkReady(k)
					if !exists || e.ready {
						if err == nil {
							t.Fatalf("MarkReady %q: no error", k)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					e.ready = true
					lru = append(lru, k)
				case op < 7:
					_, err := c.MarkReadyPinned(k)
					if !exists || e.ready {
						if err == nil {
							t.Fatalf("MarkReadyPinned %q: no error", k)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					e.ready, e.pins = true, 1
				case op < 8:
					var err error
					if rng.IntN(2) == 0 {
						_, err = c.Pin(k)
					} else {
						_, r := c.pinIfReady(k)
						if r != cachex.Pinned {
							err = errors.New(r.String())
						}
					}
					if !exists || !e.ready {
						if err == nil {
							t.Fatalf("Pin %q: no error", k)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					if e.pins == 0 {
						drop(k)
					}
					e.pins++
				case op < 9:
					err := c.Unpin(k)
					if !exists || e.pins == 0 {
						if err == nil {
							t.Fatalf("Unpin %q: no error", k)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					if e.pins--; e.pins == 0 {
						lru = append(lru, k)
					}
				case op < 10:
					err := c.Remove(k)
					if !exists || e.pins > 0 {
						if err == nil {
							t.Fatalf("Remove %q: no error", k)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					drop(k)
					release(e.blocks)
					delete(ents, k)
				default:
					retire := rng.IntN(3) == 0
					var err error
					if retire {
						err = c.Retire(k)
					} else {
						err = c.Discard(k)
					}
					if !exists || e.ready {
						if err == nil {
							t.Fatalf("drop %q: no error", k)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					if retire {
						retired += len(e.blocks)
					} else {
						release(e.blocks)
					}
					delete(ents, k)
				}
				checkFreeRuns(t, c.free, free)
				checkBlocks(t, c)
				// lru order and stats
				var order []string
				for x := c.lru.next; x != &c.lru; x = x.next {
					order = append(order, x.key)
				}
				if !slices.Equal(order, lru) {
					t.Fatalf("seed %d cap %d step %d: lru %v, model %v", seed, capacity, step, order, lru)
				}
				st := c.Stats()
				nr, pinned, evb, nfree := 0, 0, 0, countFree(free)
				for _, x := range ents {
					if !x.ready {
						nr++
					} else if x.pins > 0 {
						pinned++
					}
				}
				for _, x := range lru {
					evb += len(ents[x].blocks)
				}
				want := Stats{Capacity: capacity, Free: nfree, Retired: retired, Entries: len(ents), NotReady: nr,
					Pinned: pinned, Evictable: len(lru), EvictableBlock: evb, Evictions: evictions}
				if st != want {
					t.Fatalf("seed %d cap %d step %d: stats %+v, model %+v", seed, capacity, step, st, want)
				}
				r := rng.IntN(capacity + 2)
				if c.pressure(r) != (nfree+evb < max(maxSave, r)) {
					t.Fatalf("pressure(%d) wrong", r)
				}
				if len(ents) == nkeys && len(lru) == 0 && rng.IntN(4) == 0 {
					// everything held: let go of some
					for x, me := range ents {
						if !me.ready {
							if err := c.Discard(x); err != nil {
								t.Fatal(err)
							}
							release(me.blocks)
							delete(ents, x)
						}
					}
					checkFreeRuns(t, c.free, free)
				}
			}
		}
	}
}
