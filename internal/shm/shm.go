// Package shm is the plumbing of shared block regions between package
// cache, which makes them, and the TCP data plane, which reads a
// same-host producer's: the memfd a Shared region lives in, its header,
// and the registry of this process's Shared regions, through which a
// consumer in the producer's own process reads the producer's mapping
// (its pages are in the page tables already). The registry is the one
// thing data planes in one process share.
package shm

import (
	"errors"
	"os"
	"sync"
	"unsafe"
)

// FileName is a Shared region's memfd's name: /proc shows its descriptor
// as a link to "/memfd:" + FileName.
const FileName = "ecxfer-region"

// ErrUnsupported: shared regions need Linux (a sealed memfd).
var ErrUnsupported = errors.New("shared block regions need Linux (memfd)")

// HeaderSize is the size of a Shared region's header: 128 KiB, or a page
// if pages are larger. Its pages are touched only as the data plane uses
// them.
func HeaderSize() int { return max(128<<10, os.Getpagesize()) }

// Key names a Shared region's file: its device and inode.
type Key struct{ Dev, Ino uint64 }

// regions are this process's Shared regions, by file.
var regions = struct {
	sync.Mutex
	m map[Key]*mapping
}{m: map[Key]*mapping{}}

type mapping struct {
	mem    []byte // header and blocks, as the file lays them out
	refs   int    // the Region's own, until it closes, and each Borrow's
	closed bool   // the Region closed: lent to no one new
}

// Register records mem, the whole mapping of the Shared region in file
// key, for Borrow.
func Register(key Key, mem []byte) {
	regions.Lock()
	regions.m[key] = &mapping{mem: mem, refs: 1}
	regions.Unlock()
}

// Borrow returns the mapping of a Shared region of this process whose file
// is key, and true; the mapping stays valid, even past the Region's Close,
// until Return. False: no open Region of this process has that file.
func Borrow(key Key) ([]byte, bool) {
	regions.Lock()
	defer regions.Unlock()
	m := regions.m[key]
	if m == nil || m.closed {
		return nil, false
	}
	m.refs++
	return m.mem, true
}

// Return gives back a mapping Borrow lent; true: it was the last
// reference, and the caller unmaps it.
func Return(key Key, mem []byte) bool { return drop(key, mem, false) }

// Closed drops the Region's own reference; true: the caller unmaps it.
func Closed(key Key, mem []byte) bool { return drop(key, mem, true) }

func drop(key Key, mem []byte, owner bool) bool {
	regions.Lock()
	defer regions.Unlock()
	m := regions.m[key]
	if m == nil || unsafe.SliceData(m.mem) != unsafe.SliceData(mem) {
		return true
	}
	m.closed = m.closed || owner
	if m.refs--; m.refs > 0 {
		return false
	}
	delete(regions.m, key)
	return true
}
