package cache

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRegionAnonymous(t *testing.T) {
	r, err := NewRegion(RegionConfig{Blocks: 5, BlockSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Base()%uintptr(os.Getpagesize()) != 0 {
		t.Fatalf("base %#x not page-aligned", r.Base())
	}
	if len(r.Bytes()) != 5000 || r.Blocks() != 5 || r.BlockSize() != 1000 || r.Path() != "" {
		t.Fatal("sizes")
	}
	for i := range 5 {
		b := r.Block(i)
		if len(b) != 1000 || cap(b) != 1000 {
			t.Fatalf("block %d: len %d cap %d", i, len(b), cap(b))
		}
		for j := range b {
			b[j] = byte(i)
		}
	}
	if s := r.Span(1, 3); len(s) != 3000 || s[0] != 1 || s[2999] != 3 {
		t.Fatal("span does not cover blocks 1..3")
	}
	t.Logf("mlock: %v", r.LockErr())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal("second close:", err)
	}
}

func TestRegionBadSize(t *testing.T) {
	for _, c := range []RegionConfig{{Blocks: 0, BlockSize: 8}, {Blocks: 8, BlockSize: 0}, {Blocks: 1 << 62, BlockSize: 8}} {
		if _, err := NewRegion(c); !errors.Is(err, ErrRegionSize) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if _, err := NewRegion(RegionConfig{Blocks: 1, BlockSize: 8, Name: "../etc"}); err == nil {
		t.Error("a path was accepted as a name")
	}
}

// Two mappings of one named region see the same bytes, as an engine's
// worker process would.
func TestRegionShared(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm on this machine")
	}
	name := fmt.Sprintf("ecxfer-test-%d", os.Getpid())
	a, err := NewRegion(RegionConfig{Blocks: 4, BlockSize: 4096, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Unlink()
	defer a.Close()
	b, err := NewRegion(RegionConfig{Blocks: 4, BlockSize: 4096, Name: name, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	copy(a.Block(3), "hello")
	if string(b.Block(3)[:5]) != "hello" {
		t.Fatal("the second mapping does not see the first's bytes")
	}
	if b.LockErr() == nil {
		t.Fatal("NoLock region claims to be locked")
	}
	if _, err := NewRegion(RegionConfig{Blocks: 8, BlockSize: 4096, Name: name}); !errors.Is(err, ErrRegionSize) {
		t.Fatalf("size mismatch: %v", err)
	}
}

// A large anonymous region starts on a 2 MiB boundary, so that it can be
// backed by huge pages; with NoHugePages, only page alignment is promised.
func TestRegionHugeAlignment(t *testing.T) {
	r, err := NewRegion(RegionConfig{Blocks: 3, BlockSize: 1 << 20, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Base()%hugePage != 0 {
		t.Fatalf("base %#x not 2 MiB-aligned", r.Base())
	}
	r.Block(2)[1<<20-1] = 1 // the last byte is inside the mapping
	small, err := NewRegion(RegionConfig{Blocks: 1, BlockSize: 100, NoHugePages: true})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if small.Base()%uintptr(os.Getpagesize()) != 0 {
		t.Fatal("small region not page-aligned")
	}
}

// A Shared region is one file: what the owner writes, a reader of
// SharedPath sees; the header is apart from the blocks.
func TestSharedRegion(t *testing.T) {
	r, err := NewRegion(RegionConfig{Blocks: 4, BlockSize: 4096, NoLock: true, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(r.Header()) != HeaderSize() {
		t.Fatalf("header of %d bytes", len(r.Header()))
	}
	r.Header()[0] = 7
	r.Block(2)[5] = 9
	b, err := os.ReadFile(r.SharedPath())
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != HeaderSize()+4*4096 || b[0] != 7 || b[HeaderSize()+2*4096+5] != 9 {
		t.Fatalf("file of %d bytes does not hold the region", len(b))
	}
	// Its size is sealed: nobody, the owner included, can shrink it under
	// a reader's mapping.
	f, err := os.OpenFile(r.SharedPath(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals&SharedSeals != SharedSeals || f.Truncate(4096) == nil {
		t.Fatalf("seals %#x (%v), or the file could be shrunk", seals, err)
	}
	if _, err := NewRegion(RegionConfig{Blocks: 1, BlockSize: 8, Shared: true, Name: "x"}); err == nil {
		t.Fatal("Shared and Name together")
	}
	plain, _ := NewRegion(RegionConfig{Blocks: 1, BlockSize: 8, NoLock: true})
	defer plain.Close()
	if plain.SharedPath() != "" || plain.Header() != nil {
		t.Fatal("a plain region is shared")
	}
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
	if err := unix.Stat(r.SharedPath(), &st); err != nil {
		t.Fatal(err)
	}
	key := SharedKey{uint64(st.Dev), st.Ino}
	mem, ok := BorrowShared(key)
	if !ok || &mem[HeaderSize()] != &r.Block(0)[0] || len(mem) != HeaderSize()+4*4096 {
		t.Fatal("not the region's own mapping")
	}
	r.Block(3)[1] = 5
	r.Close()
	if mem[HeaderSize()+3*4096+1] != 5 { // still mapped
		t.Fatal("bytes lost at Close")
	}
	if _, ok := BorrowShared(key); ok {
		t.Fatal("a closed region lent its mapping")
	}
	ReturnShared(key, mem)
	sharedRegions.Lock()
	defer sharedRegions.Unlock()
	if sharedRegions.m[key] != nil {
		t.Fatal("the mapping is still registered after the last return")
	}
}
