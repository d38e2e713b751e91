// Package cache owns blocks: [EmbeddingCache] decides which entry holds which
// blocks of a fixed pool, whether an entry's data has landed, and who has it
// pinned; the block region (memory-mapped, off the Go heap) holds the bytes.
//
// Differences from the reference's EmbeddingCache:
//   - Every misuse the reference asserts on (duplicate alloc, more blocks than
//     the capacity, marking ready twice, unpinning an unpinned entry,
//     discarding a ready entry) returns an error instead of raising.
//   - A full cache answers [ErrNoSpace] instead of None, so callers branch
//     with errors.Is like on every other outcome.
//   - Operations are O(1) (an intrusive eviction list instead of a scan);
//     Alloc also pays for the blocks it hands out and the entries it evicts.
package cache
