package transport

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/internal/shm"
)

// hostileRegion is a sealed memfd of a region's name and size, with
// metadata naming it as a same-host producer's that will never welcome
// us (nothing listens at its address), and how many bytes it allocates.
func hostileRegion(t *testing.T, bs, blocks int, fill bool) (fd int, meta []byte, allocated func() int64) {
	t.Helper()
	size := int64(shm.HeaderSize()) + int64(bs)*int64(blocks)
	fd, err := unix.MemfdCreate(shm.FileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Skipf("no memfd: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if fill {
		if err := unix.Fallocate(fd, 0, 0, size); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shm.Seals); err != nil {
		t.Fatal(err)
	}
	meta = regionMeta(t, fd, bs, blocks, "x")
	return fd, meta, func() int64 {
		var st unix.Stat_t
		unix.Fstat(fd, &st)
		return st.Blocks * 512
	}
}

func regionMeta(t *testing.T, fd, bs, blocks int, incarnation string) []byte {
	m := agentMeta{Version: metaVersion, Name: "hostile", Addr: "127.0.0.1:1", Incarnation: incarnation,
		BlockSize: bs, Blocks: blocks, Shm: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd), ShmOff: shm.HeaderSize()}
	meta, err := msgpack.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	return meta
}

func sharedOf(t *testing.T, c *TCPData, agent string) *sharedPeer {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	sh := c.peers[agent].sh
	if sh == nil {
		t.Skip("the region was not mapped here")
	}
	return sh
}

// A read fault on a file hole allocates the page, charged to the process
// that faults: a region's pages are faulted in ahead of the copies only
// once its producer proved it its own, and only where the file has data.
// Even its token, read before the proof, is read with pread, which
// allocates nothing on a hole. Here a region of 256 MiB with 1 MiB of data
// is left alone while unproven, and once proven has its data faulted in
// and no hole filled.
func TestRegionPopulatedOnlyWhenProvenAndOnlyItsData(t *testing.T) {
	const bs = 4096
	c := newTCP(t, newRegion(t, 8, bs), TCPConfig{})
	fd, meta, allocated := hostileRegion(t, bs, 64<<10, false)
	if _, err := unix.Pwrite(fd, make([]byte, 1<<20), 64<<20); err != nil {
		t.Fatal(err)
	}
	atAdd := allocated()
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.RemoveRemotePeer(peer.Agent)
	sh := sharedOf(t, c, peer.Agent)
	if got := allocated(); got != atAdd {
		t.Fatalf("registering an unproven producer allocated %d KiB of its region's holes", (got-atAdd)>>10)
	}
	if !sh.populates {
		t.Skip("the mapping is not new")
	}
	select {
	case <-sh.populated:
		t.Fatal("an unproven producer's region was populated")
	case <-time.After(100 * time.Millisecond):
	}
	before := allocated()
	sh.verify(sh.want[:]) // as its welcome would
	select {
	case <-sh.populated:
	case <-time.After(10 * time.Second):
		t.Fatal("a proven region not populated after 10 s")
	}
	if got := allocated(); got > before {
		t.Fatalf("populating allocated %d KiB of the region's holes", (got-before)>>10)
	}
}

// The metadata names one of the producer's descriptors, which it can swap
// for a FIFO between our check of the path and our open; an open of a
// FIFO for reading waits for a writer, and AddRemotePeer holds the plane's
// lock. So the open never waits, and what was opened is checked: every
// registration here ends at once, the FIFO's refused, however the swaps
// fall.
func TestRegionOpenNeverWaits(t *testing.T) {
	const bs, blocks = 4096, 8
	mfd, _, _ := hostileRegion(t, bs, blocks, false)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ffd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ffd)
	slot, err := unix.Dup(mfd) // the descriptor the metadata names, swapped
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(slot)
	var stop atomic.Bool
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for i := 0; !stop.Load(); i++ {
			src := mfd
			if i%2 == 1 {
				src = ffd
			}
			unix.Dup3(src, slot, unix.O_CLOEXEC)
		}
	}()
	defer func() { stop.Store(true); <-swapped }()
	c := newTCP(t, newRegion(t, 8, bs), TCPConfig{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 3000 {
			if p, err := c.AddRemotePeer(regionMeta(t, slot, bs, blocks, fmt.Sprint(i)), nil); err == nil {
				c.RemoveRemotePeer(p.Agent)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		w, _ := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK, 0) // lets a blocked open go
		defer unix.Close(w)
		t.Fatal("a registration waited on the producer's FIFO")
	}
}

// mapShared runs under the plane's lock: a failure after the region is
// mapped releases the mapping without taking that lock again (it once
// deadlocked the plane), and the producer is read over TCP.
func TestSharedMapFailureReleasesTheMapping(t *testing.T) {
	borrowOwn = false
	defer func() { borrowOwn = true }()
	var reached atomic.Bool
	saved := readToken
	readToken = func(int, []byte) (int, error) { reached.Store(true); return 0, unix.EIO }
	defer func() { readToken = saved }()
	// Not newTCP: its cleanup, Close, would wait on a deadlocked plane.
	c, err := NewTCPData(TCPConfig{Logger: quiet}, newRegion(t, 8, 4096))
	if err != nil {
		t.Fatal(err)
	}
	_, meta, _ := hostileRegion(t, 4096, 8, false)
	added := make(chan error, 1)
	go func() {
		peer, err := c.AddRemotePeer(meta, nil)
		if err == nil {
			c.mu.Lock()
			if c.peers[peer.Agent].sh != nil {
				err = errors.New("the region is mapped though its token was unreadable")
			}
			c.mu.Unlock()
		}
		added <- err
	}()
	select {
	case err := <-added:
		if err != nil {
			t.Fatal(err)
		}
		if !reached.Load() {
			t.Fatal("the region was never mapped: the failure was not reached")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AddRemotePeer did not return: the plane is deadlocked")
	}
	defer c.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.maps) != 0 {
		t.Fatalf("%d mappings kept after the failure", len(c.maps))
	}
}
