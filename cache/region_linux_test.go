package cache

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/internal/shm"
	"github.com/ecxfer/ecxfer/xfer"
)

// A Shared region is one file: what the owner writes, a reader of
// SharedPath sees; the header is apart from the blocks.
func TestSharedRegion(t *testing.T) {
	r, err := NewRegion(RegionConfig{Blocks: 4, BlockSize: 4096, NoLock: true, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(r.header) != shm.HeaderSize() {
		t.Fatalf("header of %d bytes", len(r.header))
	}
	r.header[0] = 7
	r.Block(2)[5] = 9
	b, err := os.ReadFile(r.sharedPath())
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != shm.HeaderSize()+4*4096 || b[0] != 7 || b[shm.HeaderSize()+2*4096+5] != 9 {
		t.Fatalf("file of %d bytes does not hold the region", len(b))
	}
	// Its size is sealed: nobody, the owner included, can shrink it under
	// a reader's mapping.
	f, err := os.OpenFile(r.sharedPath(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals&shm.Seals != shm.Seals || f.Truncate(4096) == nil {
		t.Fatalf("seals %#x (%v), or the file could be shrunk", seals, err)
	}
	if _, err := NewRegion(RegionConfig{Blocks: 1, BlockSize: 8, Shared: true, Name: "x"}); err == nil {
		t.Fatal("Shared and Name together")
	}
	plain, _ := NewRegion(RegionConfig{Blocks: 1, BlockSize: 8, NoLock: true})
	defer plain.Close()
	if plain.sharedPath() != "" || plain.header != nil {
		t.Fatal("a plain region is shared")
	}
}

// A Shared region of a huge page or more asks for huge pages on its whole
// mapping before locking it, and locks it in one piece, header and blocks:
// a lock of the blocks alone would split the mapping at the header, and no
// huge page crosses a split. NoHugePages, or a smaller region, does not
// ask.
func TestSharedRegionAsksForHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage"); err != nil {
		t.Skip("no transparent huge pages in this kernel")
	}
	var unlocked error
	for _, tc := range []struct {
		blocks  int
		noHuge  bool
		advised bool
	}{{3, false, true}, {3, true, false}, {1, false, false}} {
		r, err := NewRegion(RegionConfig{Blocks: tc.blocks, BlockSize: 1 << 20, Shared: true, NoHugePages: tc.noHuge})
		if err != nil {
			t.Fatal(err)
		}
		m, err := mappingOf(r.mapping)
		lockErr := r.LockErr()
		start, end := uintptr(unsafe.Pointer(unsafe.SliceData(r.mapping))), uintptr(unsafe.Pointer(unsafe.SliceData(r.mapping)))+uintptr(len(r.mapping))
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(m.flags, "hg"); got != tc.advised {
			t.Fatalf("%d MiB, NoHugePages %v: advised %v, want %v", tc.blocks, tc.noHuge, got, tc.advised)
		}
		if lockErr != nil {
			unlocked = lockErr
			continue
		}
		if m.lo > start || m.hi < end {
			t.Fatalf("%d MiB: the locked mapping %#x-%#x is split (%#x-%#x holds its start)", tc.blocks, start, end, m.lo, m.hi)
		}
	}
	if unlocked != nil {
		t.Skipf("mlock refused (%v): whether a lock splits the mapping is not shown", unlocked)
	}
}

// mapping is what /proc/self/smaps says of one mapping: its range, and
// its VmFlags ("hg": MADV_HUGEPAGE).
type mapping struct {
	lo, hi uintptr
	flags  []string
}

// mappingOf returns the mapping that holds mem[0].
func mappingOf(mem []byte) (mapping, error) {
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return mapping{}, err
	}
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	var m mapping
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && l <= addr && addr < h
			m = mapping{lo: uintptr(l), hi: uintptr(h)}
			continue
		}
		if in && f[0] == "VmFlags:" {
			m.flags = f[1:]
			return m, nil
		}
	}
	return mapping{}, fmt.Errorf("no mapping holds %#x", addr)
}

// A Shared region lends its own mapping to readers in this process; the
// mapping outlives the Region's Close until the last one gives it back,
// and a closed region lends to no one new.
func TestBorrowShared(t *testing.T) {
	r, err := NewRegion(RegionConfig{Blocks: 4, BlockSize: 4096, NoLock: true, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(r.sharedPath(), &st); err != nil {
		t.Fatal(err)
	}
	key := shm.Key{Dev: uint64(st.Dev), Ino: st.Ino}
	mem, ok := shm.Borrow(key)
	if !ok || &mem[shm.HeaderSize()] != &r.Block(0)[0] || len(mem) != shm.HeaderSize()+4*4096 {
		t.Fatal("not the region's own mapping")
	}
	r.Block(3)[1] = 5
	r.Close()
	if mem[shm.HeaderSize()+3*4096+1] != 5 { // still mapped
		t.Fatal("bytes lost at Close")
	}
	if _, ok := shm.Borrow(key); ok {
		t.Fatal("a closed region lent its mapping")
	}
	if !shm.Return(key, mem) {
		t.Fatal("the last return does not unmap")
	}
	unix.Munmap(mem)
}

// withoutLockPrivilege runs f on a thread of its own that may lock at most
// limit bytes: RLIMIT_MEMLOCK lowered for the process, CAP_IPC_LOCK (which
// lets root lock past it) dropped from that thread. The thread ends with f.
func withoutLockPrivilege(t *testing.T, limit uint64, f func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		t.Fatal(err)
	}
	low := unix.Rlimit{Cur: limit, Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &low); err != nil {
		t.Skip("cannot lower RLIMIT_MEMLOCK:", err)
	}
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		f()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Skip("cannot drop CAP_IPC_LOCK:", err)
	}
}

// A refused mlock names the limit and the size asked for: an error from
// NewRegion with RequireLock (and nothing left mapped), LockErr without.
func TestRegionLockRefused(t *testing.T) {
	const size = 1 << 20
	var required, lenient error
	var region *Region
	withoutLockPrivilege(t, 64<<10, func() {
		_, required = NewRegion(RegionConfig{Blocks: 16, BlockSize: size / 16, RequireLock: true})
		region, lenient = NewRegion(RegionConfig{Blocks: 16, BlockSize: size / 16})
	})
	if required == nil {
		t.Fatal("RequireLock: a region past RLIMIT_MEMLOCK was made")
	}
	for _, want := range []string{"RLIMIT_MEMLOCK", "ulimit -l", "1048576", "64 KiB"} {
		if !strings.Contains(required.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, required)
		}
	}
	if lenient != nil {
		t.Fatal("without RequireLock a refused mlock failed NewRegion:", lenient)
	}
	defer region.Close()
	if region.LockErr() == nil || region.LockErr().Error() != required.Error() {
		t.Fatalf("LockErr %v, want %v", region.LockErr(), required)
	}
	if _, err := NewRegion(RegionConfig{Blocks: 1, BlockSize: 8, NoLock: true, RequireLock: true}); !errors.Is(err, xfer.ErrBadConfig) {
		t.Fatal("NoLock with RequireLock:", err)
	}
}

// Within the limit, RequireLock locks.
func TestRegionRequireLock(t *testing.T) {
	var err error
	var region *Region
	withoutLockPrivilege(t, 64<<10, func() {
		region, err = NewRegion(RegionConfig{Blocks: 4, BlockSize: 4096, RequireLock: true, NoHugePages: true})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	if region.LockErr() != nil {
		t.Fatal(region.LockErr())
	}
}
