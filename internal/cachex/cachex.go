// Package cachex reaches what package cache keeps out of its public API
// for this module's producer session and data planes: pinning an entry
// only if it is ready and unpinning it, the cache's pressure, and a Shared region's header
// and path. Package cache sets the functions in its init; engines never
// see them.
package cachex

import "fmt"

// PinResult tells the three answers of PinIfReady apart.
type PinResult uint8

const (
	Absent   PinResult = iota // no entry for the key
	NotReady                  // the entry exists, its save has not landed; not pinned
	Pinned                    // the entry is ready and now pinned once more
)

func (r PinResult) String() string {
	switch r {
	case Absent:
		return "absent"
	case NotReady:
		return "not-ready"
	case Pinned:
		return "pinned"
	}
	return fmt.Sprintf("PinResult(%d)", r)
}

// Set by package cache; c is a *cache.EmbeddingCache, r a *cache.Region.
var (
	// PinIfReady pins key if it is present and ready, and returns the
	// entry's blocks (shared with the cache: not to be modified) with
	// Absent (nil blocks), NotReady (not pinned) or Pinned.
	PinIfReady func(c any, key string) (blocks []int, res PinResult)
	// Unpin drops one pin of key, taken by PinIfReady.
	Unpin func(c any, key string) error
	// Pressure reports whether saves are short of room: the blocks a
	// save could have now (free, or held by ready unpinned entries, which
	// Alloc evicts) are fewer than the largest save yet asked for, or
	// than reserve. A producer refuses pins beyond a consumer's share
	// only then.
	Pressure func(c any, reserve int) bool
	// Header returns a Shared region's header (zeroed at creation), or nil.
	Header func(r any) []byte
	// SharedPath returns the path through which a same-host process of
	// the same user opens a Shared region's file (/proc/<pid>/fd/<fd>),
	// or "".
	SharedPath func(r any) string
)
