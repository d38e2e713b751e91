//go:build nixlfake

package nixl

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/xfer"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

var seq atomic.Int64

func newAgent(t *testing.T, blocks, size int) (*Agent, *cache.Region) {
	t.Helper()
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: size, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Name: fmt.Sprintf("agent-%d", seq.Add(1)), Params: map[string]string{"ucx_error_handling_mode": "none"}}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close() // before the region goes: nothing may write into it after
		r.Close()
	})
	return a, r
}

func TestFakeNIXLConformance(t *testing.T) {
	FakeSetDelay(200 * time.Microsecond)
	defer FakeSetDelay(0)
	xfertest.Conformance(t, func(t *testing.T) xfertest.Pair {
		c, cr := newAgent(t, 128, 256)
		p, pr := newAgent(t, 128, 256)
		return xfertest.Pair{Consumer: c, Producer: p, ConsumerBlock: cr.Block, ProducerBlock: pr.Block, Blocks: 128}
	})
}

func TestNewErrors(t *testing.T) {
	r, _ := cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 64, NoLock: true})
	defer r.Close()
	if _, err := New(Config{}, r); err == nil {
		t.Fatal("agent without a name")
	}
	if _, err := New(Config{Name: "x", Backend: "GDS"}, r); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown backend: %v", err)
	}
	a, _ := newAgent(t, 4, 64)
	if _, err := a.AddRemotePeer(a.AgentMetadata(), nil); err == nil {
		t.Fatal("empty descriptor accepted")
	}
}

// Injected NIXL errors map to their own Go errors and never leak a handle.
func TestErrorMapping(t *testing.T) {
	c, _ := newAgent(t, 8, 64)
	p, _ := newAgent(t, 8, 64)
	FakeFail(FakeLoad, -10, 1)
	if _, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor()); !errors.Is(err, ErrRemoteDisconnect) {
		t.Fatalf("load: %v", err)
	}
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil || peer.Blocks != 8 {
		t.Fatalf("%+v %v", peer, err)
	}
	FakeFail(FakePost, -3, 1)
	if _, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil); !errors.Is(err, ErrBackend) {
		t.Fatalf("post: %v", err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, []byte("s:h"))
	if err != nil {
		t.Fatal(err)
	}
	FakeFail(FakeCheck, -4, 1)
	if _, err := c.Check(h); !errors.Is(err, ErrNotFound) {
		t.Fatalf("check: %v", err)
	}
	// A READ that fails in NIXL is Failed, not an error.
	bad, _ := c.PostRead([]int{2}, peer.Agent, []int{100}, nil)
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Microsecond) {
		pg, err := c.Check(bad)
		if err != nil {
			t.Fatal(err)
		}
		if pg == xfer.Failed {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("bad READ: %s", pg)
		}
	}
	c.Release(bad)
	c.Release(h)
	if hs, rs := c.FakeLeaks(); hs != 0 || rs != 1 {
		t.Fatalf("handles %d remotes %d", hs, rs)
	}
	c.RemoveRemotePeer(peer.Agent)
	if _, rs := c.FakeLeaks(); rs != 0 {
		t.Fatal("remote agent not removed")
	}
	for st := -12; st <= -1; st++ {
		if err := statusErr("x", st); err == nil || errors.Is(err, ErrUnknown) != (st == -8) {
			t.Errorf("status %d: %v", st, err)
		}
	}
}

// A READ NIXL cannot abort: Release says the blocks may still be written,
// and the request is released once it can be.
func TestReleaseCannotAbort(t *testing.T) {
	FakeSetDelay(20 * time.Millisecond)
	defer FakeSetDelay(0)
	c, _ := newAgent(t, 8, 64)
	p, _ := newAgent(t, 8, 64)
	peer, _ := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	h, _ := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	FakeFail(FakeRelease, -6, 1)
	if err := c.Release(h); !errors.Is(err, xfer.ErrMayStillWrite) {
		t.Fatalf("release: %v", err)
	}
	if hs, _ := c.FakeLeaks(); hs != 1 {
		t.Fatalf("%d requests held", hs)
	}
	c.DrainNotifs(nil) // retries the release
	if hs, _ := c.FakeLeaks(); hs != 0 {
		t.Fatalf("%d requests held after the retry", hs)
	}
}

// Consumer and producer sessions over the fake NIXL: a hundred fetches,
// every pin released, no handle or remote agent left.
func TestSessionsOverFakeNIXL(t *testing.T) {
	FakeSetDelay(100 * time.Microsecond)
	defer FakeSetDelay(0)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cdata, cr := newAgent(t, 64, 128)
	pdata, pr := newAgent(t, 256, 128)
	entries := cache.NewEmbeddingCache(256)
	for i := range 100 {
		e, _ := entries.Alloc(fmt.Sprint(i), 2)
		for j, b := range e.Blocks {
			copy(pr.Block(b), fmt.Sprintf("item %d block %d", i, j))
		}
		entries.MarkReady(fmt.Sprint(i))
	}
	var toP, toC [][]byte
	sendP := sender(func(b []byte) { toP = append(toP, append([]byte(nil), b...)) })
	sendC := replier(func(b []byte) { toC = append(toC, append([]byte(nil), b...)) })
	cons, err := session.NewConsumerSession(session.ConsumerConfig{Logger: quiet}, sendP, cdata, "compat")
	if err != nil {
		t.Fatal(err)
	}
	prod := session.NewProducerSession(session.ProducerConfig{Logger: quiet}, pdata, entries, "compat")
	var r session.Results
	now := time.Unix(0, 0)
	for i := range 100 {
		if err := cons.StartXfer(fmt.Sprint(i), []int{(2 * i) % 64, (2*i + 1) % 64}, now, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		for step := 0; cons.HasInFlight(); step++ {
			if step > 100000 {
				t.Fatalf("fetch %d did not end", i)
			}
			var msgs []session.Message
			for _, m := range toP {
				msgs = append(msgs, session.Message{Identity: []byte("c"), Payload: m})
			}
			toP = nil
			prod.Poll(msgs, now, sendC)
			cons.Poll(toC, now)
			toC = nil
			cons.TakeResults(&r)
			time.Sleep(20 * time.Microsecond)
		}
		if got := string(cr.Block((2 * i) % 64)[:len(fmt.Sprintf("item %d block 0", i))]); got != fmt.Sprintf("item %d block 0", i) {
			t.Fatalf("fetch %d: %q", i, got)
		}
	}
	if len(r.Completed) != 100 || r.Len() != 100 {
		t.Fatalf("results %+v", r)
	}
	for end := time.Now().Add(5 * time.Second); prod.Grants() > 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
		prod.Poll(nil, now, sendC)
	}
	if prod.Grants() != 0 || entries.HasHeldEntries() {
		t.Fatalf("%d grants left", prod.Grants())
	}
	cons.Close()
	if hs, rs := cdata.FakeLeaks(); hs != 0 || rs != 0 {
		t.Fatalf("consumer holds %d requests, %d remotes", hs, rs)
	}
}

type sender func([]byte)

func (s sender) Send(b []byte) error { s(b); return nil }

type replier func([]byte)

func (r replier) Reply(_, b []byte) error { r(b); return nil }
