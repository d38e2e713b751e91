package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/internal/cachex"
	"github.com/ecxfer/ecxfer/internal/shm"
	"github.com/ecxfer/ecxfer/xfer"
)

// RegionConfig describes a block region.
type RegionConfig struct {
	Blocks              int    // number of blocks
	BlockSize           int    // bytes per block
	Name                string // backs the region with /dev/shm/<Name>, for other processes
	NoLock, RequireLock bool   // skip mlock; make a refused one NewRegion's error (else LockErr's)
	NoHugePages         bool   // turns off transparent huge pages
	Shared              bool   // a memfd, for TCPData's same-host copies (Linux)
}

// Region is equal-sized blocks in contiguous memory mapped off the Go heap,
// the only memory to hand data planes.
type Region struct {
	mem       []byte
	mapping   []byte // the whole mapping, for munmap: mem lies inside it
	blocks    int
	blockSize int
	path      string
	lockErr   error
	shared    *os.File // the memfd of a Shared region
	header    []byte
	key       shm.Key // a Shared region's file, in shm's registry
}

const hugePage = 2 << 20

// errRegionSize is wrapped with xfer.ErrBadConfig for a region whose size
// is not positive or does not match an existing file.
var errRegionSize = errors.New("cache: bad region size")

// NewRegion maps a region; xfer.ErrBadConfig for a size not positive or not
// that of Name's existing file.
func NewRegion(cfg RegionConfig) (*Region, error) {
	if cfg.Blocks <= 0 || cfg.BlockSize <= 0 || cfg.Blocks > (1<<62)/cfg.BlockSize {
		return nil, fmt.Errorf("%w: %w: %d blocks of %d bytes", xfer.ErrBadConfig, errRegionSize, cfg.Blocks, cfg.BlockSize)
	}
	if cfg.NoLock && cfg.RequireLock {
		return nil, fmt.Errorf("%w: cache: a region is NoLock or RequireLock, not both", xfer.ErrBadConfig)
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
		head := shm.HeaderSize()
		if r.shared, err = shm.Create(head + mapped); err != nil {
			return nil, fmt.Errorf("cache: shared region: %w", err)
		}
		fd := int(r.shared.Fd())
		r.mapping, err = unix.Mmap(fd, 0, head+mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			r.shared.Close()
			return nil, fmt.Errorf("cache: mmap %d bytes: %w", head+mapped, err)
		}
		if !cfg.NoHugePages && mapped >= hugePage {
			// Before mlock faults it in, over the header too: the
			// first huge page holds it.
			shm.AdviseHuge(r.mapping)
		}
		r.header = r.mapping[:head:head]
		r.mem = r.mapping[head:]
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			r.key = shm.Key{Dev: uint64(st.Dev), Ino: st.Ino}
			shm.Register(r.key, r.mapping)
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
			shm.AdviseHuge(r.mem)
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
		locked := r.mem
		if r.shared != nil {
			locked = r.mapping // the header too, in one piece with the blocks
		}
		if err := unix.Mlock(locked); err != nil {
			r.lockErr = lockError(len(locked), err)
			if cfg.RequireLock {
				r.Close()
				return nil, r.lockErr
			}
		}
	} else {
		r.lockErr = errors.New("cache: mlock not asked for")
	}
	return r, nil
}

// lockError says why mlock refused size bytes (a Shared region's header
// included) and what to change.
func lockError(size int, err error) error {
	limit := "unknown"
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) == nil {
		if rl.Cur >= 1<<62 { // RLIM_INFINITY
			limit = "unlimited"
		} else {
			limit = fmt.Sprintf("%d KiB", rl.Cur>>10)
		}
	}
	return fmt.Errorf("cache: mlock of the region's %d bytes (%.1f MiB) refused: %w; the locked-memory limit RLIMIT_MEMLOCK (ulimit -l) is %s: raise it, or do not lock (NoLock)",
		size, float64(size)/(1<<20), err, limit)
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
		return nil, fmt.Errorf("%w: %w: %s has %d bytes, want %d", xfer.ErrBadConfig, errRegionSize, path, st.Size(), size)
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

// Close unmaps the region; nothing may use it after. A file stays (Unlink).
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	m := r.mapping
	r.mem, r.mapping, r.header = nil, nil, nil
	if r.shared != nil {
		r.shared.Close()
		if r.key != (shm.Key{}) && !shm.Closed(r.key, m) {
			return nil // borrowed: the last Return unmaps it
		}
	}
	return unix.Munmap(m)
}

// sharedPath returns the path through which a same-host process of the
// same user opens a Shared region's file (/proc/<pid>/fd/<fd>), or "".
func (r *Region) sharedPath() string {
	if r.shared == nil {
		return ""
	}
	return shm.Path(r.shared)
}

func init() {
	cachex.Header = func(r any) []byte { return r.(*Region).header }
	cachex.SharedPath = func(r any) string { return r.(*Region).sharedPath() }
}

// Unlink removes the backing file; mappings stay valid until closed.
func (r *Region) Unlink() error {
	if r.path == "" {
		return nil
	}
	return os.Remove(r.path)
}
