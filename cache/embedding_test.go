package cache

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ecxfer/ecxfer/internal/cachex"
)

func mustAlloc(t *testing.T, c *EmbeddingCache, key string, n int) Entry {
	t.Helper()
	e, err := c.Alloc(key, n)
	if err != nil {
		t.Fatalf("Alloc(%q, %d): %v", key, n, err)
	}
	return e
}

func mustReady(t *testing.T, c *EmbeddingCache, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if err := c.MarkReady(k); err != nil {
			t.Fatalf("MarkReady(%q): %v", k, err)
		}
	}
}

func has(c *EmbeddingCache, key string) bool { _, ok := c.Get(key); return ok }

// As the reference: ascending unique ids, empty entries for zero blocks,
// fresh entries neither ready nor evictable, lookups of the same entry.
func TestAllocAscendingUniqueIDs(t *testing.T) {
	c := NewEmbeddingCache(8)
	e := mustAlloc(t, c, "a", 3)
	if len(e.Blocks) != 3 || !slices.IsSorted(e.Blocks) {
		t.Fatalf("blocks %v: want 3 ascending", e.Blocks)
	}
	seen := map[int]bool{}
	for _, b := range e.Blocks {
		if b < 0 || b >= 8 || seen[b] {
			t.Fatalf("blocks %v: out of range or repeated", e.Blocks)
		}
		seen[b] = true
	}
	if e.Ready || e.Pins != 0 {
		t.Fatalf("fresh entry %+v: want not ready, unpinned", e)
	}
	if st := c.Stats(); st.Evictable != 0 || st.NotReady != 1 || st.Free != 5 {
		t.Fatalf("stats %+v", st)
	}
	got, ok := c.Get("a")
	if !ok || !slices.Equal(got.Blocks, e.Blocks) || got.Ready {
		t.Fatalf("Get = %+v, %v", got, ok)
	}
	if _, ok := c.Get("zz"); ok {
		t.Fatal("Get of an absent key found something")
	}
	z := mustAlloc(t, c, "zero", 0)
	if len(z.Blocks) != 0 {
		t.Fatalf("zero-block alloc gave %v", z.Blocks)
	}
	// Ids come out ascending even after frees scramble the free list.
	mustAlloc(t, c, "b", 5)
	if err := c.Discard("a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Discard("b"); err != nil {
		t.Fatal(err)
	}
	e = mustAlloc(t, c, "c", 8)
	if !slices.Equal(e.Blocks, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Fatalf("blocks %v", e.Blocks)
	}
}

// Misuse is a typed error (the reference asserts); a full cache ErrNoSpace,
// evicting nothing when it cannot make room.
func TestAllocErrors(t *testing.T) {
	c := NewEmbeddingCache(4)
	mustAlloc(t, c, "a", 2)
	if _, err := c.Alloc("a", 1); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate alloc: %v", err)
	}
	if _, err := c.Alloc("big", 5); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over capacity: %v", err)
	}
	if _, err := c.Alloc("neg", -1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("negative: %v", err)
	}
	mustAlloc(t, c, "b", 2)
	mustReady(t, c, "b")
	if err := pin(c, "b"); err != nil {
		t.Fatal(err)
	}
	// Everything pinned or not ready: nothing evicted.
	if _, err := c.Alloc("c", 1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("full cache: %v", err)
	}
	if !has(c, "a") || !has(c, "b") {
		t.Fatal("a failed alloc evicted something")
	}
	// Fail fast: one evictable block is not enough for two; nothing evicted.
	c2 := NewEmbeddingCache(3)
	mustAlloc(t, c2, "x", 1)
	mustAlloc(t, c2, "y", 1)
	mustReady(t, c2, "y")
	mustAlloc(t, c2, "w", 1)
	if _, err := c2.Alloc("z", 2); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("want ErrNoSpace, got %v", err)
	}
	if !has(c2, "y") || c2.Stats().Evictions != 0 {
		t.Fatal("failed alloc evicted y")
	}
}

// Ready, pin, unpin and discard rules (pins nest; misuse is an error), and
// the not-found paths.
func TestReadyPinUnpinDiscard(t *testing.T) {
	c := NewEmbeddingCache(4)
	mustAlloc(t, c, "a", 1)
	if err := pin(c, "a"); !errors.Is(err, errNotReady) {
		t.Fatalf("pin not ready: %v", err)
	}
	mustReady(t, c, "a")
	if err := c.MarkReady("a"); !errors.Is(err, errAlreadyReady) {
		t.Fatalf("double ready: %v", err)
	}
	for _, err := range []error{c.MarkReady("x"), pin(c, "x"), c.unpin("x"), c.Discard("x")} {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("absent key: %v", err)
		}
	}
	if st := c.Stats(); st.Evictable != 1 {
		t.Fatalf("ready entry not evictable: %+v", st)
	}
	for range 2 {
		if err := pin(c, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.unpin("a"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Evictable != 0 || st.Pinned != 1 {
		t.Fatalf("one pin left, yet %+v", st)
	}
	if err := c.unpin("a"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Evictable != 1 || st.Pinned != 0 {
		t.Fatalf("all pins gone, yet %+v", st)
	}
	if err := c.unpin("a"); !errors.Is(err, errNotPinned) {
		t.Fatalf("unpin unpinned: %v", err)
	}
	if err := c.Discard("a"); !errors.Is(err, errReady) {
		t.Fatalf("discard ready: %v", err)
	}
	mustAlloc(t, c, "b", 3)
	if err := c.Discard("b"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Free != 3 || st.Entries != 1 || st.NotReady != 0 {
		t.Fatalf("after discard %+v", st)
	}
}

// PinIfReady (the newest reference's answer) and whether entries are held.
func TestPinIfReadyAndHeld(t *testing.T) {
	c := NewEmbeddingCache(4)
	if c.hasHeldEntries() {
		t.Fatal("empty cache holds entries")
	}
	if _, r := c.pinIfReady("a"); r != cachex.Absent {
		t.Fatalf("absent: %v", r)
	}
	mustAlloc(t, c, "a", 2)
	if !c.hasHeldEntries() {
		t.Fatal("not-ready entry is not held")
	}
	if e, r := c.pinIfReady("a"); r != cachex.NotReady || e.Pins != 0 || len(e.Blocks) != 2 {
		t.Fatalf("not ready: %v %+v", r, e)
	}
	mustReady(t, c, "a")
	if c.hasHeldEntries() {
		t.Fatal("ready unpinned entry is held")
	}
	e, r := c.pinIfReady("a")
	if r != cachex.Pinned || e.Pins != 1 || !e.Ready {
		t.Fatalf("ready: %v %+v", r, e)
	}
	if !c.hasHeldEntries() {
		t.Fatal("pinned entry is not held")
	}
	if err := c.unpin("a"); err != nil {
		t.Fatal(err)
	}
	if c.hasHeldEntries() {
		t.Fatal("held after the last unpin")
	}
	for _, r := range []cachex.PinResult{cachex.Absent, cachex.NotReady, cachex.Pinned, 9} {
		if r.String() == "" {
			t.Fatal("empty name")
		}
	}
}

// Eviction order: oldest evictable first, pinned and unready entries
// survive, an unpinned entry goes to the back.
func TestEvictionOrder(t *testing.T) {
	tests := []struct {
		name      string
		size      int
		setup     func(t *testing.T, c *EmbeddingCache)
		alloc     int
		evicted   []string
		survivors []string
	}{
		{"oldest first", 2, func(t *testing.T, c *EmbeddingCache) {
			mustAlloc(t, c, "A", 1)
			mustAlloc(t, c, "B", 1)
			mustReady(t, c, "A", "B")
		}, 1, []string{"A"}, []string{"B"}},
		{"pinned survives", 2, func(t *testing.T, c *EmbeddingCache) {
			mustAlloc(t, c, "A", 1)
			mustAlloc(t, c, "B", 1)
			mustReady(t, c, "A", "B")
			pin(c, "A")
		}, 1, []string{"B"}, []string{"A"}},
		{"not ready survives", 2, func(t *testing.T, c *EmbeddingCache) {
			mustAlloc(t, c, "A", 1)
			mustAlloc(t, c, "B", 1)
			mustReady(t, c, "B")
		}, 1, []string{"B"}, []string{"A"}},
		{"two oldest for four blocks", 6, func(t *testing.T, c *EmbeddingCache) {
			for _, k := range []string{"A", "B", "D"} {
				mustAlloc(t, c, k, 2)
				mustReady(t, c, k)
			}
		}, 4, []string{"A", "B"}, []string{"D"}},
		{"order is when evictable, not insertion", 2, func(t *testing.T, c *EmbeddingCache) {
			mustAlloc(t, c, "A", 1)
			mustAlloc(t, c, "B", 1)
			mustReady(t, c, "A", "B")
			pin(c, "A")
			c.unpin("A") // A moves behind B
		}, 1, []string{"B"}, []string{"A"}},
		{"ready order, not alloc order", 2, func(t *testing.T, c *EmbeddingCache) {
			mustAlloc(t, c, "A", 1)
			mustAlloc(t, c, "B", 1)
			mustReady(t, c, "B", "A")
		}, 1, []string{"B"}, []string{"A"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewEmbeddingCache(tt.size)
			tt.setup(t, c)
			mustAlloc(t, c, "C", tt.alloc)
			for _, k := range tt.evicted {
				if has(c, k) {
					t.Errorf("%s not evicted", k)
				}
			}
			for _, k := range tt.survivors {
				if !has(c, k) {
					t.Errorf("%s evicted", k)
				}
			}
			if st := c.Stats(); st.Evictions != uint64(len(tt.evicted)) {
				t.Errorf("evictions %d, want %d", st.Evictions, len(tt.evicted))
			}
		})
	}
}

// Concurrent pins on one entry, then concurrent allocs.
func TestConcurrentUse(t *testing.T) {
	c := NewEmbeddingCache(4)
	mustAlloc(t, c, "hot", 1)
	mustReady(t, c, "hot")
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				if err := pin(c, "hot"); err != nil {
					errs <- err
					return
				}
				if err := c.unpin("hot"); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	if e, ok := c.Get("hot"); !ok || e.Pins != 0 || c.Stats().Evictable != 1 {
		t.Fatalf("hot ended as %+v", e)
	}
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				k := fmt.Sprintf("k%d-%d", g, i)
				if _, err := c.Alloc(k, 1+i%2); err != nil {
					if !errors.Is(err, ErrNoSpace) {
						errs <- err
					}
					continue
				}
				if err := c.MarkReady(k); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := c.Stats(); st.Free+st.EvictableBlock != 4 || st.NotReady != 0 || st.Pinned != 0 {
		t.Fatalf("blocks do not add up: %+v", st)
	}
}

// Pressure: a save as large as the largest yet (or as reserve) would not
// find room, whether saves are under way or not.
func TestPressure(t *testing.T) {
	c := NewEmbeddingCache(12)
	if c.pressure(12) {
		t.Fatal("an empty cache under pressure")
	}
	mustAlloc(t, c, "a", 4)
	mustReady(t, c, "a")
	if err := pin(c, "a"); err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, c, "b", 3) // under way: 5 blocks free
	if c.pressure(3) || !c.pressure(6) {
		t.Fatalf("5 free, largest save 4: pressure(3) %v, pressure(6) %v", c.pressure(3), c.pressure(6))
	}
	mustReady(t, c, "b") // evictable: 8 blocks for a save
	if c.pressure(8) || !c.pressure(9) {
		t.Fatalf("8 blocks for a save: pressure(8) %v, pressure(9) %v", c.pressure(8), c.pressure(9))
	}
	if err := pin(c, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc("c", 6); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("save of 6 with 5 free: %v", err)
	}
	if !c.pressure(1) {
		t.Fatal("no pressure after a save found no room")
	}
	mustAlloc(t, c, "d", 3)
	mustReady(t, c, "d") // 5 blocks for a save: still short of the largest, 6
	if !c.pressure(1) {
		t.Fatal("no pressure with less room than the largest save")
	}
	if err := c.unpin("b"); err != nil {
		t.Fatal(err)
	}
	if c.pressure(1) {
		t.Fatal("pressure with room for the largest save")
	}
}

func pin(c *EmbeddingCache, key string) error {
	_, err := c.Pin(key)
	return err
}

func TestHoldAPI(t *testing.T) {
	c := NewEmbeddingCache(4)
	if _, err := c.Alloc("a", 2); err != nil {
		t.Fatal(err)
	}
	e, err := c.MarkReadyPinned("a")
	if err != nil || !e.Ready || e.Pins != 1 {
		t.Fatalf("MarkReadyPinned: %+v, %v", e, err)
	}
	if _, err := c.MarkReadyPinned("a"); err == nil {
		t.Fatal("MarkReadyPinned twice accepted")
	}
	// Held: an Alloc that needs its blocks finds no room, and Remove refuses.
	if _, err := c.Alloc("b", 3); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Alloc over a held entry: %v", err)
	}
	if err := c.Remove("a"); !errors.Is(err, ErrPinned) {
		t.Fatalf("Remove of a held entry: %v", err)
	}
	if err := c.Unpin("a"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Pinned != 0 || st.Evictable != 1 {
		t.Fatalf("after Unpin: %+v", st)
	}
	// A ready, unheld entry can be removed; its blocks are free again.
	if err := c.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Free != 4 || st.Entries != 0 || st.Evictable != 0 || st.EvictableBlock != 0 {
		t.Fatalf("after Remove: %+v", st)
	}
	// So can one not ready.
	if _, err := c.Alloc("n", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("n"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Free != 4 || st.NotReady != 0 {
		t.Fatalf("after Remove of a not-ready entry: %+v", st)
	}
	if err := c.Remove("n"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Remove twice: %v", err)
	}
	if _, err := c.Pin("n"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Pin of nothing: %v", err)
	}
	if _, err := c.Alloc("r", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pin("r"); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Pin of a not-ready entry: %v", err)
	}
}

// A retired entry's blocks are never handed out again.
func TestRetire(t *testing.T) {
	c := NewEmbeddingCache(3)
	if _, err := c.Alloc("w", 2); err != nil {
		t.Fatal(err)
	}
	if err := c.Retire("w"); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Retired != 2 || st.Free != 1 || st.Entries != 0 || st.NotReady != 0 {
		t.Fatalf("%+v", st)
	}
	if _, err := c.Alloc("x", 2); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a retired block was handed out again: %v", err)
	}
	if _, err := c.Alloc("x", 1); err != nil {
		t.Fatal(err)
	}
	c.MarkReady("x")
	if err := c.Retire("x"); err == nil {
		t.Fatal("a ready entry was retired")
	}
}
