// Package cache owns blocks: [EmbeddingCache] tracks which entry holds which
// blocks of a fixed pool, whether its data has landed, and who has it pinned;
// a [Region], memory mapped off the Go heap, holds the bytes a data plane
// reads and writes. Misuse is an error, never a panic.
//
//	e, err := entries.Alloc(mmHash, n) // ErrNoSpace: no room now
//	for i, b := range e.Blocks { // ascending, not always contiguous
//		copy(region.Block(b), embedding[i*region.BlockSize():])
//	}
//	err = entries.MarkReady(mmHash) // readers Pin it, then Unpin
package cache
