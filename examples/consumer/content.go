package main

// The workload both programs agree on (the same file is in
// examples/producer and examples/consumer).

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/ecxfer/ecxfer/wire"
)

// CompatHash is the compatibility hash of this producer and its consumers:
// both sides must agree on the model, the dtype and the block size.
func CompatHash(blockSize int) string {
	return wire.CompatHash("ecxfer-demo", "demo/model", "torch.bfloat16", blockSize)
}

// Hash is item i's mm_hash (a content hash, in an engine).
func Hash(i int) string {
	s := sha256.Sum256(fmt.Appendf(nil, "ecxfer demo item %d", i))
	return hex.EncodeToString(s[:])
}

// Fill writes the content of block j of item i into b.
func Fill(b []byte, item, j int) {
	x := (uint64(item)<<20|uint64(j))*0x9e3779b97f4a7c15 + 1
	for k := 0; k+8 <= len(b); k += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[k:], x)
	}
}
