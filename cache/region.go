package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RegionConfig describes a block region.
type RegionConfig struct {
	Blocks    int // number of blocks
	BlockSize int // bytes per block
	// Name, if set, backs the region with the file /dev/shm/<Name> so that
	// another process (an engine's worker) can map the same blocks. The
	// file is created if absent and must have the region's size if present.
	// Empty: anonymous memory.
	Name string
	// NoLock skips mlock. By default the region is locked in RAM; a refusal
	// (RLIMIT_MEMLOCK) is reported by LockErr, not fatal.
	NoLock bool
	// NoHugePages keeps the region on base pages. By default an anonymous
	// region is aligned to 2 MiB and asks for transparent huge pages: on
	// the development VM that more than doubled the data plane's
	// throughput over a cold region (TLB misses dominate its copies).
	NoHugePages bool
	// Shared backs the region with an anonymous memory file (memfd) that
	// same-host processes of the same user can map read-only through
	// SharedPath: TCPData's same-host path copies blocks straight out of
	// it. The file's first HeaderSize bytes are a header the data plane
	// owns (a token proving a reader mapped this very file, a revocation
	// counter, a table of the live grants); the blocks follow. The kernel
	// frees the file with the last process holding it, so a crash leaves
	// nothing in /dev/shm. It excludes Name, and shared memory is on base
	// pages (shmem transparent huge pages are usually off).
	Shared bool
}

// Region is a fixed pool of equal-sized blocks in memory mapped outside the
// Go heap, page-aligned and contiguous: block i starts at Base()+i*BlockSize.
// Only region memory is ever handed to a data plane, so a DMA engine or a
// peer can read and write it while the Go runtime moves and frees its own
// objects.
type Region struct {
	mem       []byte
	mapping   []byte // the whole mapping, for munmap: mem lies inside it
	blocks    int
	blockSize int
	path      string
	lockErr   error
	shared    *os.File // the memfd of a Shared region
	header    []byte
	key       SharedKey // a Shared region's file, in sharedRegions
}

// SharedSeals are the seals a Shared region's memfd carries: its size
// cannot change, so a reader that checks them can map it without fear of
// SIGBUS.
const SharedSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// SharedFileName is the name of a Shared region's memfd: /proc shows its
// descriptor as a link to "/memfd:" + SharedFileName.
const SharedFileName = "ecxfer-region"

// HeaderSize is the size of a Shared region's header: 128 KiB, or a page
// if pages are larger. Its pages are touched only as the data plane uses
// them.
func HeaderSize() int { return max(128<<10, os.Getpagesize()) }

const hugePage = 2 << 20

// ErrRegionSize is returned for a region whose size is not positive or does
// not match an existing file.
var ErrRegionSize = errors.New("cache: bad region size")

// NewRegion maps a region.
func NewRegion(cfg RegionConfig) (*Region, error) {
	if cfg.Blocks <= 0 || cfg.BlockSize <= 0 || cfg.Blocks > (1<<62)/cfg.BlockSize {
		return nil, fmt.Errorf("%w: %d blocks of %d bytes", ErrRegionSize, cfg.Blocks, cfg.BlockSize)
	}
	size := cfg.Blocks * cfg.BlockSize
	page := os.Getpagesize()
	mapped := (size + page - 1) / page * page
	r := &Region{blocks: cfg.Blocks, blockSize: cfg.BlockSize}
	var err error
	switch {
	case cfg.Shared:
		if cfg.Name != "" {
			return nil, errors.New("cache: a region is Shared or Named, not both")
		}
		fd, err := unix.MemfdCreate(SharedFileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return nil, fmt.Errorf("cache: memfd_create: %w", err)
		}
		r.shared = os.NewFile(uintptr(fd), SharedFileName)
		// /proc/<pid>/fd already keeps other users out; the mode too.
		if err := unix.Fchmod(fd, 0o600); err != nil {
			r.shared.Close()
			return nil, fmt.Errorf("cache: chmod region file: %w", err)
		}
		head := HeaderSize()
		if err := r.shared.Truncate(int64(head + mapped)); err != nil {
			r.shared.Close()
			return nil, fmt.Errorf("cache: size region file: %w", err)
		}
		// Its size is final: a reader's mapping can never run past the
		// file's end (SIGBUS), whatever this process does later.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, SharedSeals|unix.F_SEAL_SEAL); err != nil {
			r.shared.Close()
			return nil, fmt.Errorf("cache: seal region file: %w", err)
		}
		r.mapping, err = unix.Mmap(fd, 0, head+mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			r.shared.Close()
			return nil, fmt.Errorf("cache: mmap %d bytes: %w", head+mapped, err)
		}
		r.header = r.mapping[:head:head]
		r.mem = r.mapping[head:]
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			r.key = SharedKey{uint64(st.Dev), st.Ino}
			sharedRegions.Lock()
			sharedRegions.m[r.key] = &sharedMapping{mem: r.mapping, refs: 1}
			sharedRegions.Unlock()
		}
	case cfg.Name == "":
		huge := !cfg.NoHugePages && mapped >= hugePage
		extra := 0
		if huge {
			extra = hugePage // room to align the start
		}
		r.mapping, err = unix.Mmap(-1, 0, mapped+extra, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return nil, fmt.Errorf("cache: mmap %d bytes: %w", mapped, err)
		}
		off := 0
		if huge {
			base := uintptr(unsafe.Pointer(unsafe.SliceData(r.mapping)))
			off = int((hugePage - base%hugePage) % hugePage)
		}
		r.mem = r.mapping[off : off+mapped]
		if huge {
			_ = unix.Madvise(r.mem, unix.MADV_HUGEPAGE) // best effort: THP may be off
		}
	default:
		if cfg.Name != filepath.Base(cfg.Name) || cfg.Name == "." || cfg.Name == ".." {
			return nil, fmt.Errorf("cache: region name %q is not a plain file name", cfg.Name)
		}
		r.path = filepath.Join("/dev/shm", cfg.Name)
		if r.mem, err = mapFile(r.path, mapped); err != nil {
			return nil, err
		}
		r.mapping = r.mem
	}
	r.mem = r.mem[:size:size]
	if !cfg.NoLock {
		if err := unix.Mlock(r.mem); err != nil {
			r.lockErr = fmt.Errorf("cache: mlock %d bytes: %w", size, err)
		}
	} else {
		r.lockErr = errors.New("cache: mlock not asked for")
	}
	return r, nil
}

func mapFile(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cache: open region file: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cache: stat region file: %w", err)
	}
	switch st.Size() {
	case 0:
		if err := f.Truncate(int64(size)); err != nil {
			return nil, fmt.Errorf("cache: size region file: %w", err)
		}
	case int64(size):
	default:
		return nil, fmt.Errorf("%w: %s has %d bytes, want %d", ErrRegionSize, path, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("cache: mmap region file: %w", err)
	}
	return mem, nil
}

// Blocks returns the number of blocks.
func (r *Region) Blocks() int { return r.blocks }

// BlockSize returns the size of one block in bytes.
func (r *Region) BlockSize() int { return r.blockSize }

// Base returns the address of block 0.
func (r *Region) Base() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(r.mem))) }

// Bytes returns the whole region.
func (r *Region) Bytes() []byte { return r.mem }

// Block returns block i. It panics if i is out of range, like a slice index.
func (r *Region) Block(i int) []byte {
	off := i * r.blockSize
	return r.mem[off : off+r.blockSize : off+r.blockSize]
}

// Span returns n consecutive blocks from block i as one slice.
func (r *Region) Span(i, n int) []byte {
	off := i * r.blockSize
	end := off + n*r.blockSize
	return r.mem[off:end:end]
}

// LockErr returns why the region is not locked in RAM, or nil if it is.
func (r *Region) LockErr() error { return r.lockErr }

// Path returns the backing file, or "" for anonymous memory.
func (r *Region) Path() string { return r.path }

// Close unmaps the region. The backing file, if any, stays: see Unlink.
// The region must not be used after Close, by this process or a data plane.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	m := r.mapping
	r.mem, r.mapping, r.header = nil, nil, nil
	if r.shared != nil {
		r.shared.Close()
		if r.key != (SharedKey{}) && !dropShared(r.key, m, true) {
			return nil // borrowed: the last Return unmaps it
		}
	}
	return unix.Munmap(m)
}

// SharedKey names a Shared region's file: its device and inode.
type SharedKey struct{ Dev, Ino uint64 }

// sharedRegions are this process's Shared regions, by file, so that a
// consumer in the same process reads a producer's region through the
// producer's own mapping: its pages are in the page tables already.
var sharedRegions = struct {
	sync.Mutex
	m map[SharedKey]*sharedMapping
}{m: map[SharedKey]*sharedMapping{}}

type sharedMapping struct {
	mem    []byte // header and blocks, as the file lays them out
	refs   int    // the Region's own, until Close, and each Borrow's
	closed bool   // the Region closed: lent to no one new
}

// BorrowShared returns the mapping of a Shared region of this process whose
// file is key (header and blocks, laid out as in the file), and true; the
// mapping stays valid, even past the Region's Close, until ReturnShared.
// False: no open Region of this process has that file.
func BorrowShared(key SharedKey) ([]byte, bool) {
	sharedRegions.Lock()
	defer sharedRegions.Unlock()
	m := sharedRegions.m[key]
	if m == nil || m.closed {
		return nil, false
	}
	m.refs++
	return m.mem, true
}

// ReturnShared gives back a mapping BorrowShared lent.
func ReturnShared(key SharedKey, mem []byte) {
	if dropShared(key, mem, false) {
		unix.Munmap(mem)
	}
}

// dropShared drops a reference to key's mapping mem, the owner's if
// owner; true: it was the last, and the caller unmaps it.
func dropShared(key SharedKey, mem []byte, owner bool) bool {
	sharedRegions.Lock()
	defer sharedRegions.Unlock()
	m := sharedRegions.m[key]
	if m == nil || unsafe.SliceData(m.mem) != unsafe.SliceData(mem) {
		return true
	}
	m.closed = m.closed || owner
	if m.refs--; m.refs > 0 {
		return false
	}
	delete(sharedRegions.m, key)
	return true
}

// SharedPath returns the path through which a same-host process of the
// same user opens a Shared region's file (/proc/<pid>/fd/<fd>), or "".
func (r *Region) SharedPath() string {
	if r.shared == nil {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), r.shared.Fd())
}

// Header returns a Shared region's header (HeaderSize bytes, zeroed at
// creation), or nil.
func (r *Region) Header() []byte { return r.header }

// Unlink removes the backing file; mappings stay valid until closed.
func (r *Region) Unlink() error {
	if r.path == "" {
		return nil
	}
	return os.Remove(r.path)
}
