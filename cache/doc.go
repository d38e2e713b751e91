// Package cache owns blocks: [EmbeddingCache] tracks which entry holds which
// blocks of a fixed pool, whether its data has landed, and who has it pinned;
// a [Region], memory mapped off the Go heap, holds the bytes a data plane
// reads and writes.
//
// An encoder saves an entry with Alloc, writes its blocks in the region and
// calls MarkReady. A reader holds it with Pin while it reads, and lets it go
// with Unpin, once per Pin. Ready, unpinned entries are evicted oldest first
// when Alloc needs room; a full cache answers [ErrNoSpace]. Misuse is an
// error, never a panic.
//
//	e, err := entries.Alloc(mmHash, n) // n blocks; ErrNoSpace: no room now
//	if err != nil {
//		return err
//	}
//	for i, b := range e.Blocks { // ascending, not always contiguous
//		copy(region.Block(b), embedding[i*region.BlockSize():])
//	}
//	return entries.MarkReady(mmHash)
//
// Design notes: docs/design.md.
package cache
