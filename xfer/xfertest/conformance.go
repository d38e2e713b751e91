package xfertest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Pair is a consumer and a producer data plane for Conformance.
type Pair struct {
	Consumer, Producer           xfer.DataTransport // the producer must authorize every READ
	ConsumerBlock, ProducerBlock func(i int) []byte // block i's bytes on each side
	Blocks                       int                // blocks on each side, at least 64
}

// Conformance checks the xfer.DataTransport contract on a fresh newPair per
// subtest; waiting for a READ, it calls only Check and DrainNotifs, as loops do.
func Conformance(t *testing.T, newPair func(t *testing.T) Pair) {
	t.Run("read", func(t *testing.T) {
		p, peer := setup(t, newPair)
		fill(p.ProducerBlock(3), 3)
		fill(p.ProducerBlock(4), 4)
		h, err := p.Consumer.PostRead([]int{1, 2}, peer.Agent, []int{3, 4}, []byte("sid:hash"))
		if err != nil {
			t.Fatal(err)
		}
		if got := waitEnd(t, p, h); got != xfer.Complete {
			t.Fatalf("READ ended %s", got)
		}
		if !bytes.Equal(p.ConsumerBlock(1), p.ProducerBlock(3)) || !bytes.Equal(p.ConsumerBlock(2), p.ProducerBlock(4)) {
			t.Fatal("bytes differ")
		}
		n := waitNotifs(t, p, 1)
		if n[0].Agent == "" || string(n[0].Msg) != "sid:hash" {
			t.Fatalf("notif %+v", n[0])
		}
		if err := p.Consumer.Release(h); err != nil {
			t.Fatalf("release: %v", err)
		}
		if _, err := p.Consumer.Check(h); !errors.Is(err, xfer.ErrUnknownHandle) {
			t.Fatalf("check after release: %v", err)
		}
		if err := p.Consumer.Release(h); !errors.Is(err, xfer.ErrUnknownHandle) {
			t.Fatalf("second release: %v", err)
		}
		if more := drainFor(p, 50*time.Millisecond); len(more) != 0 {
			t.Fatalf("notification delivered again: %+v", more)
		}
	})
	t.Run("many in flight", func(t *testing.T) {
		p, peer := setup(t, newPair)
		const n = 32
		hs := make([]xfer.Handle, n)
		for i := range n {
			fill(p.ProducerBlock(i), byte(i+1))
			var err error
			hs[i], err = p.Consumer.PostRead([]int{n + i}, peer.Agent, []int{i}, fmt.Appendf(nil, "s:%d", i))
			if err != nil {
				t.Fatal(err)
			}
		}
		for i, h := range hs {
			if got := waitEnd(t, p, h); got != xfer.Complete {
				t.Fatalf("READ %d ended %s", i, got)
			}
			if !bytes.Equal(p.ConsumerBlock(n+i), p.ProducerBlock(i)) {
				t.Fatalf("READ %d: bytes differ", i)
			}
			p.Consumer.Release(h)
		}
		seen := map[string]int{}
		for _, nt := range waitNotifs(t, p, n) {
			seen[string(nt.Msg)]++
		}
		for i := range n {
			if seen[fmt.Sprintf("s:%d", i)] != 1 {
				t.Fatalf("notification %d seen %d times", i, seen[fmt.Sprintf("s:%d", i)])
			}
		}
	})
	t.Run("refused posts", func(t *testing.T) {
		p, peer := setup(t, newPair)
		if _, err := p.Consumer.PostRead([]int{1}, peer.Agent, []int{1, 2}, nil); !errors.Is(err, xfer.ErrLengthMismatch) {
			t.Fatalf("length mismatch: %v", err)
		}
		if _, err := p.Consumer.PostRead([]int{1}, "nobody", []int{1}, nil); err == nil {
			t.Fatal("READ from an unknown agent posted")
		}
		if _, err := p.Consumer.AddRemotePeer([]byte("not metadata"), nil); err == nil {
			t.Fatal("garbage metadata registered")
		}
		if _, err := p.Consumer.Check(xfer.Handle(1 << 60)); !errors.Is(err, xfer.ErrUnknownHandle) {
			t.Fatalf("unknown handle: %v", err)
		}
	})
	t.Run("remove peer", func(t *testing.T) {
		p, peer := setup(t, newPair)
		if err := p.Consumer.RemoveRemotePeer(peer.Agent); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Consumer.PostRead([]int{1}, peer.Agent, []int{1}, nil); err == nil {
			t.Fatal("READ posted to a removed peer")
		}
		if err := p.Consumer.RemoveRemotePeer(peer.Agent); err == nil {
			t.Fatal("second removal succeeded")
		}
		// Registered twice, removed once: still usable.
		a, _ := p.Consumer.AddRemotePeer(p.Producer.AgentMetadata(), p.Producer.MemDescriptor())
		p.Consumer.AddRemotePeer(p.Producer.AgentMetadata(), p.Producer.MemDescriptor())
		p.Consumer.RemoveRemotePeer(a.Agent)
		h, err := p.Consumer.PostRead([]int{1}, a.Agent, []int{1}, []byte("x:y"))
		if err != nil {
			t.Fatal(err)
		}
		if got := waitEnd(t, p, h); got != xfer.Complete {
			t.Fatalf("READ ended %s", got)
		}
	})
	t.Run("shape", func(t *testing.T) {
		// A consumer that takes shapes reads as well from a producer it
		// registered from its region's shape, when the descriptor is one.
		p := &rig{Pair: newPair(t)}
		t.Cleanup(func() {
			p.Consumer.Close()
			p.Producer.Close()
		})
		sp, ok := plane.As[plane.ShapedPeers](p.Consumer)
		if !ok {
			t.Skip("the consumer does not take producers' shapes")
		}
		shape, regular, err := wire.DecodeBlocks(p.Producer.MemDescriptor())
		if err != nil || !regular {
			t.Skipf("the producer's descriptor is not a shape: %v", err)
		}
		peer, err := sp.AddRemotePeerShape(p.Producer.AgentMetadata(), shape)
		if err != nil || peer.Blocks != shape.Count {
			t.Fatalf("add peer from %+v: %+v, %v", shape, peer, err)
		}
		fill(p.ProducerBlock(3), 0x5a)
		h, err := p.Consumer.PostRead([]int{2}, peer.Agent, []int{3}, []byte("s:shape"))
		if err != nil {
			t.Fatal(err)
		}
		if got := waitEnd(t, p, h); got != xfer.Complete || !bytes.Equal(p.ConsumerBlock(2), p.ProducerBlock(3)) {
			t.Fatalf("READ ended %s; bytes equal %v", got, bytes.Equal(p.ConsumerBlock(2), p.ProducerBlock(3)))
		}
		p.Consumer.Release(h)
	})
	t.Run("release in flight", func(t *testing.T) {
		p, peer := setup(t, newPair)
		h, err := p.Consumer.PostRead([]int{5, 6, 7}, peer.Agent, []int{1, 2, 3}, []byte("s:r"))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Consumer.Release(h); err != nil && !errors.Is(err, xfer.ErrMayStillWrite) {
			t.Fatalf("release: %v", err)
		}
		if _, err := p.Consumer.Check(h); !errors.Is(err, xfer.ErrUnknownHandle) {
			t.Fatalf("check after release: %v", err)
		}
	})
	t.Run("close with reads in flight", func(t *testing.T) {
		p, peer := setup(t, newPair)
		var hs []xfer.Handle
		for i := range 16 {
			h, err := p.Consumer.PostRead([]int{i}, peer.Agent, []int{i}, []byte("s:c"))
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		if err := p.Consumer.Close(); err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if pr, err := p.Consumer.Check(h); err == nil && pr == xfer.InProgress {
				t.Fatalf("handle %d in progress after close", h)
			}
		}
		if _, err := p.Consumer.PostRead([]int{1}, peer.Agent, []int{1}, nil); err == nil {
			t.Fatal("READ posted after close")
		}
		if err := p.Consumer.Close(); err != nil {
			t.Fatalf("second close: %v", err)
		}
	})
}

func setup(t *testing.T, newPair func(t *testing.T) Pair) (*rig, xfer.Peer) {
	t.Helper()
	p := &rig{Pair: newPair(t)}
	t.Cleanup(func() {
		p.Consumer.Close()
		p.Producer.Close()
	})
	peer, err := p.Consumer.AddRemotePeer(p.Producer.AgentMetadata(), p.Producer.MemDescriptor())
	if err != nil {
		t.Fatalf("add peer: %v", err)
	}
	if peer.Agent == "" || peer.Blocks < 64 {
		t.Fatalf("peer %+v", peer)
	}
	return p, peer
}

// rig is a pair under test, with the notifications the producer gave up
// while the suite drove it.
type rig struct {
	Pair
	stash []xfer.Notif
}

// drive calls the producer's DrainNotifs once, as its step loop would.
func (r *rig) drive(t *testing.T) {
	t.Helper()
	var err error
	if r.stash, err = r.Producer.DrainNotifs(r.stash); err != nil {
		t.Fatalf("drain: %v", err)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed ^ byte(i*7)
	}
}

// waitLimit bounds every wait of the suite (a variable for its own tests).
var waitLimit = 10 * time.Second

// waitEnd checks h until it leaves InProgress, driving the producer, for at
// most waitLimit.
func waitEnd(t *testing.T, r *rig, h xfer.Handle) xfer.Progress {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		p, err := r.Consumer.Check(h)
		if err != nil {
			t.Fatalf("check %d: %v", h, err)
		}
		if p != xfer.InProgress {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("READ %d still in progress after %v", h, waitLimit)
		}
		r.drive(t)
		time.Sleep(100 * time.Microsecond)
	}
}

// waitNotifs drives the producer until n notifications came, for at most
// waitLimit, and takes them.
func waitNotifs(t *testing.T, r *rig, n int) []xfer.Notif {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for len(r.stash) < n {
		r.drive(t)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d notifications after %v", len(r.stash), n, waitLimit)
		}
		time.Sleep(100 * time.Microsecond)
	}
	got := r.stash
	r.stash = nil
	if len(got) > n {
		t.Fatalf("%d notifications, want %d: %+v", len(got), n, got)
	}
	return got
}

func drainFor(r *rig, dur time.Duration) []xfer.Notif {
	got := r.stash
	r.stash = nil
	for end := time.Now().Add(dur); time.Now().Before(end); time.Sleep(time.Millisecond) {
		got, _ = r.Producer.DrainNotifs(got)
	}
	return got
}
