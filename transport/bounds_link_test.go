package transport

import (
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// stalledAddr is a producer address whose dials hang: its accept queue is
// full, so the kernel drops the SYNs. It skips when this kernel answers
// them anyway.
func stalledAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	syscall.Listen(fd, 0)
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 4 { // fill the accept queue
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel accepts beyond the queue: no dial stalls")
	}
	return addr
}

// READs released while their producer's dial hangs give their places back
// at once: MaxQueued more READs posted after them are taken, round after
// round, not failed for want of room in the writers' queue (or, to a
// producer that pushes, the first connection's). Each READ's place is
// given back once: when everything ended, none is counted.
func TestReleasedReadsFreeTheirPlaces(t *testing.T) {
	for _, push := range []bool{false, true} {
		t.Run(fmt.Sprintf("push %v", push), func(t *testing.T) { releasedReadsFreeTheirPlaces(t, push) })
	}
}

func releasedReadsFreeTheirPlaces(t *testing.T, push bool) {
	const max = 8
	addr := stalledAddr(t)
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{MaxQueued: max, DialTimeout: time.Minute})
	m := metaOf(t, agentMetaBytes(t, "stalled", addr, 64, 8, metaVersion))
	m.Push = push
	peer, err := c.AddRemotePeer(agentMetaBytesOf(t, m), nil)
	if err != nil {
		t.Fatal(err)
	}
	notif := []byte("a:b")
	if push { // a grant's: it goes on the first connection, where pushes come
		notif = []byte("s:m#1.0102030405060708090a0b0c0d0e0f10")
	}
	c.mu.Lock()
	p := c.peers[peer.Agent]
	c.mu.Unlock()
	for round := range 5 {
		var hs []xfer.Handle
		for i := range max {
			h, err := c.PostRead([]int{0}, peer.Agent, []int{1}, notif)
			if err != nil {
				t.Fatalf("round %d, READ %d: %v", round, i, err)
			}
			if got, _ := c.Check(h); got != xfer.InProgress {
				t.Fatalf("round %d, READ %d: %v at once, with %d of %d places taken", round, i, got, p.inflight.Load(), max)
			}
			hs = append(hs, h)
		}
		if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, notif); err == nil {
			t.Fatalf("round %d: a READ past MaxQueued was taken", round)
		}
		for _, h := range hs {
			c.Release(h)
		}
		if n := p.inflight.Load(); n != 0 {
			t.Fatalf("round %d: %d places taken after every READ was released", round, n)
		}
	}
	// The last round's READs are left to the shutdown, which fails them.
	for range max / 2 {
		if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, notif); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if n := p.inflight.Load(); n != 0 {
		t.Fatalf("%d places counted after Close", n)
	}
}
