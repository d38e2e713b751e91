// Package cache owns blocks: [EmbeddingCache] decides which entry holds
// which blocks of a fixed pool, whether an entry's data has landed, and who
// has it pinned; a [Region] (memory-mapped, off the Go heap) holds the
// bytes, and is what a data plane reads and writes.
//
// An encoder saves an entry with Alloc, writes its blocks in the region and
// calls MarkReady; a reader holds it with Pin while it reads, and lets it
// go with Unpin, once per Pin. Ready, unpinned entries are evicted oldest
// first when Alloc needs room; a full cache answers [ErrNoSpace]. Misuse
// (marking ready twice, unpinning an entry not pinned) is an error, never
// a panic.
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
// The design, and why (where it differs from vLLM's reference):
// docs/design.md in the repository.
package cache
