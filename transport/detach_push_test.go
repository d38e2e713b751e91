package transport

import (
	"sync/atomic"
	"testing"
)

// Pushes waiting behind a write when their session detaches are not
// written once the write ends, on a connection that stays open: the
// session ended their grants. Each one's hold ends, once, and a push
// offered after the Detach is declined.
func TestDetachDropsWaitingPushes(t *testing.T) {
	_, p, _, _, g, _ := pushPair(t)
	s := servedOne(t, p)
	s.wmu.Lock() // a write under way
	var released atomic.Int32
	const n = 4
	for range n {
		if !g.att.Push(1, g.grant(0), []int{0}, func() { released.Add(1) }) {
			t.Fatal("a push was declined before the Detach")
		}
	}
	g.att.Detach()
	if g.att.Push(1, g.grant(0), []int{0}, func() { t.Error("a declined push's hold was ended by the plane") }) {
		t.Fatal("a detached session's push was taken")
	}
	s.wmu.Unlock()
	until(t, "every waiting push's hold ends", func() bool { return released.Load() == n })
	if isClosed(s.gone) {
		t.Fatal("the connection was closed")
	}
	p.Close() // waits for the drainer
	if got := released.Load(); got != n || p.Stats().PushesSent != 0 {
		t.Fatalf("%d holds ended, %d pushed", got, p.Stats().PushesSent)
	}
}
