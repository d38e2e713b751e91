package cache

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ecxfer/ecxfer/internal/cachex"
)

// Errors of EmbeddingCache; ErrNoSpace is a full cache's normal answer.
var (
	ErrNoSpace   = errors.New("cache: not enough free or evictable blocks")
	ErrTooLarge  = errors.New("cache: more blocks than the capacity")
	ErrDuplicate = errors.New("cache: duplicate alloc")
	ErrNotFound  = errors.New("cache: no such entry")
	ErrNotReady  = errors.New("cache: entry is not ready")
	ErrPinned    = errors.New("cache: entry is pinned")

	errNotReady     = ErrNotReady
	errAlreadyReady = errors.New("cache: entry is already ready")
	errNotPinned    = errors.New("cache: entry is not pinned")
	errReady        = errors.New("cache: entry is ready and cannot be discarded")
)

// Entry is a snapshot of one entry. Do not modify Blocks.
type Entry struct {
	Key    string
	Blocks []int // ascending
	Ready  bool
	Pins   int
}

// Stats counts what the cache holds and has done.
type Stats struct {
	Capacity, Free, Retired   int    // blocks in all; owned by no entry; kept out of use for good (Retire)
	Entries, NotReady, Pinned int    // entries held; whose save has not landed; ready with a pin
	Evictable, EvictableBlock int    // ready, unpinned entries; the blocks they hold
	Evictions                 uint64 // entries evicted by Alloc so far
}

type entry struct {
	key        string
	blocks     []int
	ready      bool
	pins       int
	prev, next *entry // in the evictable list while ready and unpinned
}

// EmbeddingCache owns the blocks of a fixed pool; Alloc evicts ready, unpinned
// entries, oldest first. It is safe for concurrent use.
type EmbeddingCache struct {
	mu        sync.Mutex
	capacity  int
	free      *freeRuns
	entries   map[string]*entry
	lru       entry // sentinel of the evictable list: lru.next is the oldest
	evictable int   // blocks held by entries on the evictable list
	nEvict    int   // entries on the evictable list
	notReady  int
	pinned    int
	evictions uint64
	retired   int // blocks retired: never handed out again
	maxSave   int // the most blocks an Alloc asked for
}

// NewEmbeddingCache returns a cache of numBlocks blocks, ids 0..numBlocks-1.
func NewEmbeddingCache(numBlocks int) *EmbeddingCache {
	if numBlocks < 0 {
		numBlocks = 0
	}
	c := &EmbeddingCache{capacity: numBlocks, free: newFreeRuns(numBlocks), entries: make(map[string]*entry)}
	c.lru.prev, c.lru.next = &c.lru, &c.lru
	return c
}

// Alloc creates key's not-ready entry of n blocks, in one run where it can
// (docs/design.md); ErrNoSpace: none evicted; ErrTooLarge, ErrDuplicate.
func (c *EmbeddingCache) Alloc(key string, n int) (Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; ok {
		return Entry{}, fmt.Errorf("%w: %q", ErrDuplicate, key)
	}
	if n < 0 || n > c.capacity {
		return Entry{}, fmt.Errorf("%w: %d blocks asked, capacity %d", ErrTooLarge, n, c.capacity)
	}
	c.maxSave = max(c.maxSave, n)
	if c.free.n+c.evictable < n {
		return Entry{}, ErrNoSpace
	}
	for c.free.n < n {
		c.evictLocked(c.lru.next)
	}
	// Fewer runs (freeRuns) at a small cost: while no free run holds the
	// entry, the next oldest go too, each of 1 to limit blocks (one of
	// none frees nothing), until limit are free: 4n or a sixteenth of the
	// cache, whichever is less. They were due to go next; the cache holds
	// under 2*limit blocks less.
	limit := min(4*n, c.capacity/16)
	for !c.free.holds(n) && c.free.n < limit && c.lru.next != &c.lru &&
		len(c.lru.next.blocks) > 0 && len(c.lru.next.blocks) <= limit {
		c.evictLocked(c.lru.next)
	}
	blocks := c.free.take(make([]int, 0, n), n)
	e := &entry{key: key, blocks: blocks}
	c.entries[key] = e
	c.notReady++
	return e.snapshot(), nil
}

func (c *EmbeddingCache) evictLocked(e *entry) {
	c.unlinkLocked(e)
	delete(c.entries, e.key)
	c.free.release(e.blocks)
	c.evictions++
}

func (c *EmbeddingCache) linkLocked(e *entry) {
	e.prev, e.next = c.lru.prev, &c.lru
	c.lru.prev.next = e
	c.lru.prev = e
	c.evictable += len(e.blocks)
	c.nEvict++
}

func (c *EmbeddingCache) unlinkLocked(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	c.evictable -= len(e.blocks)
	c.nEvict--
}

func (c *EmbeddingCache) lookupLocked(key string) (*entry, error) {
	if e, ok := c.entries[key]; ok {
		return e, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrNotFound, key)
}

func (e *entry) snapshot() Entry {
	return Entry{Key: e.key, Blocks: e.blocks, Ready: e.ready, Pins: e.pins}
}

// MarkReady records that key's data has landed: it becomes evictable.
func (c *EmbeddingCache) MarkReady(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.markReadyLocked(key)
	return err
}

func (c *EmbeddingCache) markReadyLocked(key string) (*entry, error) {
	e, err := c.lookupLocked(key)
	if err != nil {
		return nil, err
	}
	if e.ready {
		return nil, fmt.Errorf("%w: %q", errAlreadyReady, key)
	}
	e.ready = true
	c.notReady--
	c.linkLocked(e)
	return e, nil
}

// Pin keeps key's ready entry, to read it, until each Pin has its Unpin. It
// fails with ErrNotFound, or ErrNotReady before MarkReady.
func (c *EmbeddingCache) Pin(key string) (Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, err := c.lookupLocked(key)
	if err != nil {
		return Entry{}, err
	}
	if !e.ready {
		return Entry{}, fmt.Errorf("%w: %q", errNotReady, key)
	}
	c.pinLocked(e)
	return e.snapshot(), nil
}

// Unpin lets go of one pin; after the last the entry is the newest evictable.
func (c *EmbeddingCache) Unpin(key string) error { return c.unpin(key) }

// MarkReadyPinned is MarkReady and Pin at once: no Alloc evicts in between.
func (c *EmbeddingCache) MarkReadyPinned(key string) (Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, err := c.markReadyLocked(key)
	if err != nil {
		return Entry{}, err
	}
	c.pinLocked(e)
	return e.snapshot(), nil
}

// Remove drops key's entry and frees its blocks; ErrNotFound, ErrPinned.
func (c *EmbeddingCache) Remove(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, err := c.lookupLocked(key)
	if err != nil {
		return err
	}
	switch {
	case e.pins > 0:
		return fmt.Errorf("%w: %q (%d pins)", ErrPinned, key, e.pins)
	case e.ready:
		c.unlinkLocked(e)
	default:
		c.notReady--
	}
	delete(c.entries, key)
	c.free.release(e.blocks)
	return nil
}

func (c *EmbeddingCache) pinLocked(e *entry) {
	if e.pins == 0 {
		c.unlinkLocked(e)
		c.pinned++
	}
	e.pins++
}

func init() {
	cachex.PinIfReady = func(c any, key string) ([]int, cachex.PinResult) {
		e, r := c.(*EmbeddingCache).pinIfReady(key)
		return e.Blocks, r
	}
	cachex.Pressure = func(c any, n int) bool { return c.(*EmbeddingCache).pressure(n) }
	cachex.Unpin = func(c any, key string) error { return c.(*EmbeddingCache).unpin(key) }
}

// pinIfReady pins key if it is present and ready. It returns the entry with
// Absent (zero Entry), NotReady (not pinned) or Pinned.
func (c *EmbeddingCache) pinIfReady(key string) (Entry, cachex.PinResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return Entry{}, cachex.Absent
	}
	if !e.ready {
		return e.snapshot(), cachex.NotReady
	}
	c.pinLocked(e)
	return e.snapshot(), cachex.Pinned
}

// unpin drops one pin; the last one makes the entry evictable again, at the
// back of the eviction order.
func (c *EmbeddingCache) unpin(key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, err := c.lookupLocked(key)
	if err != nil {
		return err
	}
	if e.pins == 0 {
		return fmt.Errorf("%w: %q", errNotPinned, key)
	}
	e.pins--
	if e.pins == 0 {
		c.pinned--
		c.linkLocked(e)
	}
	return nil
}

// Discard drops a not-ready entry (a save that will not land), freeing blocks.
func (c *EmbeddingCache) Discard(key string) error { return c.drop(key, false) }

// Retire is Discard for a write that may still land: its blocks stay unused.
func (c *EmbeddingCache) Retire(key string) error { return c.drop(key, true) }

// drop removes a not-ready entry: its blocks go back to the free list, or
// out of use for good (retire).
func (c *EmbeddingCache) drop(key string, retire bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, err := c.lookupLocked(key)
	if err != nil {
		return err
	}
	if e.ready {
		return fmt.Errorf("%w: %q", errReady, key)
	}
	delete(c.entries, key)
	c.notReady--
	if retire {
		c.retired += len(e.blocks)
	} else {
		c.free.release(e.blocks)
	}
	return nil
}

// Get returns key's entry, ready or not.
func (c *EmbeddingCache) Get(key string) (Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return Entry{}, false
	}
	return e.snapshot(), true
}

// pressure reports whether saves are short of room: the blocks a save
// could have now (free, or held by ready unpinned entries, which Alloc
// evicts) are fewer than the largest save yet asked for, or than reserve.
// A producer refuses pins beyond a consumer's share only then, so that
// the next save, as large as the largest yet, finds room.
func (c *EmbeddingCache) pressure(reserve int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.free.n+c.evictable < max(c.maxSave, reserve)
}

// hasHeldEntries reports whether any entry is not ready or pinned.
func (c *EmbeddingCache) hasHeldEntries() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notReady > 0 || c.pinned > 0
}

// Stats returns the current counts.
func (c *EmbeddingCache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{
		Capacity:       c.capacity,
		Free:           c.free.n,
		Entries:        len(c.entries),
		NotReady:       c.notReady,
		Pinned:         c.pinned,
		Evictable:      c.nEvict,
		EvictableBlock: c.evictable,
		Evictions:      c.evictions,
		Retired:        c.retired,
	}
}
