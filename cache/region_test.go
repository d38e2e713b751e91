package cache

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/ecxfer/ecxfer/xfer"
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
	if len(r.Bytes()) != 5000 || r.Blocks() != 5 || r.BlockSize() != 1000 || r.path != "" {
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
		if _, err := NewRegion(c); !errors.Is(err, xfer.ErrBadConfig) {
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
	if _, err := NewRegion(RegionConfig{Blocks: 8, BlockSize: 4096, Name: name}); !errors.Is(err, xfer.ErrBadConfig) {
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
