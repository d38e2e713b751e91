//go:build nixlfake

package nixl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// The C fake moves bytes on threads of its own after a delay, or, as UCX
// over shared memory does, within the post.
var variants = []variant{{name: "fake"}, {name: "fake-inline", inline: true, setup: func(t *testing.T) {
	fakeSetInline(true)
	t.Cleanup(func() { fakeSetInline(false) })
}}}

func needNIXL(t *testing.T, err error) {}

func init() { fakeSetDelay(100 * time.Microsecond) }

func TestNewErrors(t *testing.T) {
	r, _ := cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 64, NoLock: true})
	defer r.Close()
	if _, err := New(Config{}, r); !errors.Is(err, errInvalidParam) {
		t.Fatalf("agent without a name: %v", err)
	}
	if _, err := New(Config{Name: "x"}, nil); !errors.Is(err, errInvalidParam) {
		t.Fatalf("agent without a region: %v", err)
	}
	if _, err := New(Config{Name: "x", Progress: 7}, r); !errors.Is(err, errInvalidParam) {
		t.Fatalf("unknown progress mode: %v", err)
	}
	if _, err := New(Config{Name: "x", Backend: "GDS"}, r); !errors.Is(err, errNotFound) {
		t.Fatalf("unknown backend: %v", err)
	}
	if _, err := New(Config{Name: "x"}, nil); !errors.Is(err, xfer.ErrBadConfig) {
		t.Fatalf("agent without a region: %v, want xfer.ErrBadConfig", err)
	}
	// The default posts a READ of up to 256 KiB in the step; InlinePost
	// -1 hands every READ off.
	for _, c := range []struct {
		cfg    Config
		inline int
	}{{Config{}, 4096}, {Config{InlinePost: -1}, -1}, {Config{InlinePost: 128}, 2}, {Config{InlinePost: 100}, 1}} {
		a, _ := newAgent(t, variants[0], 4, 64, c.cfg)
		if a.inline != c.inline {
			t.Errorf("%+v: READs of up to %d blocks posted in the step, want %d", c.cfg, a.inline, c.inline)
		}
	}
	a, _ := newAgent(t, variants[0], 4, 64, Config{})
	if _, err := a.AddRemotePeer(a.AgentMetadata(), nil); err == nil {
		t.Fatal("empty descriptor accepted")
	}
}

// Injected NIXL errors map to their own Go errors and never leak a handle.
func TestErrorMapping(t *testing.T) {
	// Only the test's calls drive the agents: a progress goroutine's own
	// check would take the injected failures.
	c, _ := newAgent(t, variants[0], 8, 64, Config{Progress: ProgressCaller})
	p, _ := newAgent(t, variants[0], 8, 64, Config{Progress: ProgressCaller})
	fakeFail(fakeLoad, -10, 1)
	if _, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor()); !errors.Is(err, errRemoteDisconnect) {
		t.Fatalf("load: %v", err)
	}
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil || peer.Blocks != 8 {
		t.Fatalf("%+v %v", peer, err)
	}
	fakeFail(fakePost, -3, 1)
	if _, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil); !errors.Is(err, errBackend) {
		t.Fatalf("post: %v", err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, []byte("s:h"))
	if err != nil {
		t.Fatal(err)
	}
	fakeFail(fakeCheck, -4, 1)
	if _, err := c.Check(h); !errors.Is(err, errNotFound) {
		t.Fatalf("check: %v", err)
	}
	// A READ that fails in NIXL is Failed, not an error.
	bad, err := c.PostRead([]int{2}, peer.Agent, []int{3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fakeFail(fakeCheck, -3, 1)
	if pg, err := c.Check(bad); err != nil || pg != xfer.Failed {
		t.Fatalf("failed READ: %s, %v", pg, err)
	}
	c.Release(bad)
	c.Release(h) // may still run: kept, and released once it ends
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		c.DrainNotifs(nil) // reaps what has ended
		hs, rs := c.fakeLeaks()
		if hs == 0 && rs == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("handles %d remotes %d", hs, rs)
		}
	}
	c.RemoveRemotePeer(peer.Agent)
	if _, rs := c.fakeLeaks(); rs != 0 {
		t.Fatal("remote agent not removed")
	}
	for st := -12; st <= -1; st++ {
		if err := statusErr("x", st); err == nil || errors.Is(err, errUnknown) != (st == -8) {
			t.Errorf("status %d: %v", st, err)
		}
	}
}

// A READ released while it runs is not handed to NIXL to abort: Release
// says the blocks may still be written, and the request is released once
// it has ended.
func TestReleaseWhileRunning(t *testing.T) {
	c, peer := slowPair(t, Config{Progress: ProgressCaller})
	h, _ := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	if err := c.Release(h); !errors.Is(err, xfer.ErrMayStillWrite) {
		t.Fatalf("release: %v", err)
	}
	if hs, _ := c.fakeLeaks(); hs != 1 {
		t.Fatalf("%d requests held", hs)
	}
	c.DrainNotifs(nil) // still running: kept
	if hs, _ := c.fakeLeaks(); hs != 1 {
		t.Fatalf("%d requests held while running", hs)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.DrainNotifs(nil) // released once it has ended
		if hs, _ := c.fakeLeaks(); hs == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("request still held 5 s after its READ was due to end")
		}
	}
}

// By default the step loop's calls never wait for a call into C (a post
// over UCX shared memory copies inside it): with C held, PostRead hands
// the READ to the progress goroutine, Check says InProgress, DrainNotifs
// returns, and a READ released while queued is never posted.
func TestStepNeverWaitsForC(t *testing.T) {
	c, _ := newAgent(t, variants[0], 8, 64, Config{})
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	c.cmu.Lock() // as a long post by the progress goroutine would
	held := true
	defer func() {
		if held { // a failure below: let Close have C
			c.cmu.Unlock()
		}
	}()
	returnsWithin5s(t, "a step-loop call waited for C", func() error {
		h, err := c.PostRead([]int{1}, peer.Agent, []int{2}, []byte("s:h"))
		if err != nil {
			return err
		}
		if pg, err := c.Check(h); pg != xfer.InProgress || err != nil {
			return fmt.Errorf("check of a queued READ: %v, %v", pg, err)
		}
		if _, err := c.DrainNotifs(nil); err != nil {
			return err
		}
		return c.Release(h) // queued: never posted, nothing to wait for
	})
	// The next post NIXL sees fails: if it is the next READ's, the
	// released one never reached NIXL.
	fakeFail(fakePost, -3, 1)
	held = false
	c.cmu.Unlock()
	// Posted in the step (C free) the refusal is PostRead's error, else
	// the READ ends Failed.
	h, err := c.PostRead([]int{3}, peer.Agent, []int{4}, nil)
	if err == nil {
		if pg := waitEnded(t, c, h); pg != xfer.Failed {
			t.Fatalf("the READ after the released one: %v (the released READ was posted)", pg)
		}
		err = c.Release(h)
	} else if errors.Is(err, errBackend) {
		err = nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if hs, _ := c.fakeLeaks(); hs != 0 {
		t.Fatalf("%d requests held", hs)
	}
}

// returnsWithin5s runs f, step-loop calls, on a goroutine, and fails the
// test with its error, or with what unless it returns within 5 s.
func returnsWithin5s(t *testing.T, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal(what)
	}
}

// A READ handed to the progress goroutine and released while it posts it
// may still write: Release says so, and its request is released once it
// has ended. One NIXL refuses there ends Failed, with nothing to release.
func TestHandedOffRelease(t *testing.T) {
	c, peer := slowPair(t, Config{InlinePost: -1})
	var h xfer.Handle
	var err error
	released := make(chan error, 1)
	c.beforePost = func() { released <- c.Release(h) }
	c.cmu.Lock() // h is set before the progress goroutine can post it
	h, err = c.PostRead([]int{1}, peer.Agent, []int{1}, []byte("s:h"))
	c.cmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-released:
		if !errors.Is(err, xfer.ErrMayStillWrite) {
			t.Fatalf("release while posting: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the READ was never posted")
	}
	c.beforePost = nil
	if hs, _ := c.fakeLeaks(); hs != 1 {
		t.Fatalf("%d requests held while the READ runs", hs)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if hs, _ := c.fakeLeaks(); hs == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("request still held 5 s after its READ was due to end")
		}
	}

	fakeFail(fakePost, -3, 1)
	bad, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, bad); pg != xfer.Failed {
		t.Fatalf("refused READ: %v", pg)
	}
	if err := c.Release(bad); err != nil {
		t.Fatal(err)
	}
	if hs, _ := c.fakeLeaks(); hs != 0 {
		t.Fatalf("%d requests held after a refused post", hs)
	}
}

// A READ of at most InlinePost bytes is posted in the step when C is
// free: NIXL's refusal is PostRead's error, and a READ that NIXL ends is
// recorded ended when PostRead returns. A larger one is handed to the
// progress goroutine even then, and NIXL's refusal ends it Failed.
func TestInlinePost(t *testing.T) {
	fakeSetInline(true)
	defer fakeSetInline(false)
	c, cr := newAgent(t, variants[0], 8, 64, Config{InlinePost: 64, IdlePoll: time.Hour})
	p, pr := newAgent(t, variants[0], 8, 64, Config{})
	for i := range 8 {
		xfertestFill(pr.Block(i), byte(i))
	}
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	// The goroutine may take C for a round of its own just as PostRead
	// tries: then the READ is handed off, and the test tries again.
	inStep := func(local, remote []int, fail bool) (bool, error) {
		for range 20 {
			settle(t, c)
			var handed atomic.Bool
			c.beforePost = func() { handed.Store(true) }
			if fail {
				fakeFail(fakePost, -3, 1)
			}
			h, err := c.PostRead(local, peer.Agent, remote, nil)
			if err != nil {
				return true, err
			}
			c.mu.Lock()
			r := c.handles[h]
			stepped, ended := r.phase == posted && !handed.Load(), r.ended
			c.mu.Unlock()
			pg := waitEnded(t, c, h)
			if stepped && (!ended || pg != xfer.Complete) {
				t.Fatalf("READ posted in the step: recorded ended %v, then %v", ended, pg)
			}
			if err := c.Release(h); err != nil {
				t.Fatal(err)
			}
			if stepped {
				return true, nil
			}
			if fail && pg != xfer.Failed {
				t.Fatalf("READ refused on the goroutine: %v", pg)
			}
		}
		return false, nil
	}
	if ok, err := inStep([]int{1}, []int{5}, false); err != nil || !ok {
		t.Fatalf("one block: %v, posted in the step %v", err, ok)
	}
	if !bytes.Equal(cr.Block(1), pr.Block(5)) {
		t.Fatal("bytes differ")
	}
	if ok, err := inStep([]int{2}, []int{6}, true); !errors.Is(err, errBackend) || !ok {
		t.Fatalf("one block refused: %v, posted in the step %v", err, ok)
	}
	// Two blocks (128 B) are over InlinePost: always handed off.
	settle(t, c)
	var handed atomic.Int32
	c.beforePost = func() { handed.Add(1) }
	fakeFail(fakePost, -3, 1)
	h, err := c.PostRead([]int{3, 4}, peer.Agent, []int{6, 7}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Failed || handed.Load() != 1 {
		t.Fatalf("two blocks, refused: %v, handed off %d times", pg, handed.Load())
	}
	c.Release(h)
	// With inlineHeld READs held, one block is handed off too.
	var held []xfer.Handle
	for len(held) < inlineHeld {
		h, err := c.PostRead([]int{len(held) % 8}, peer.Agent, []int{1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		waitEnded(t, c, h)
		held = append(held, h)
	}
	handed.Store(0)
	h, err = c.PostRead([]int{0}, peer.Agent, []int{2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Complete || handed.Load() != 1 {
		t.Fatalf("one block beside %d held READs: %v, handed off %d times", len(held), pg, handed.Load())
	}
	for _, h := range append(held, h) {
		c.Release(h)
	}
	waitLeaks(t, c, 0, 1)
}

// An ended READ is released in C by Release itself when C is free, not
// left for the progress goroutine to wake for.
func TestInlineRelease(t *testing.T) {
	// The goroutine's pause lasts an hour: once the READ has ended it
	// waits, holding no lock, until something wakes it.
	c, _ := newAgent(t, variants[0], 8, 64, Config{ProgressDelay: time.Hour, IdlePoll: time.Hour})
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Complete {
		t.Fatalf("READ: %v", pg)
	}
	settle(t, c)
	if err := c.Release(h); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	left := len(c.ended)
	c.mu.Unlock()
	if hs, _ := c.fakeLeaksLocked(); left != 0 || hs != 0 { // the fake counts under a lock of its own
		t.Fatalf("released: %d left for the progress goroutine, %d requests held", left, hs)
	}
}

// slowPair returns a consumer agent made with cfg and the peer it added,
// a producer agent, with the fake's READs taking 20 ms.
func slowPair(t *testing.T, cfg Config) (*Agent, xfer.Peer) {
	t.Helper()
	fakeSetDelay(20 * time.Millisecond)
	t.Cleanup(func() { fakeSetDelay(100 * time.Microsecond) })
	c, _ := newAgent(t, variants[0], 8, 64, cfg)
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	return c, peer
}

// By default AddRemotePeer and RemoveRemotePeer leave their calls
// into C (NIXL's loadRemoteMD takes milliseconds) to the progress
// goroutine: with C held they return, a READ posted to a peer still
// loading waits behind its load and lands the right bytes, and a removal
// happens after what was queued before it.
func TestAsyncPeerLoad(t *testing.T) {
	c, cr := newAgent(t, variants[0], 8, 64, Config{})
	p, pr := newAgent(t, variants[0], 8, 64, Config{})
	q, _ := newAgent(t, variants[0], 8, 64, Config{})
	for i := range 8 {
		for j := range pr.Block(i) {
			pr.Block(i)[j] = byte(i*64 + j)
		}
	}
	c.cmu.Lock() // as a long post by the progress goroutine would
	held := true
	defer func() {
		if held { // a failure below: let Close have C
			c.cmu.Unlock()
		}
	}()
	var peer, other xfer.Peer
	var h xfer.Handle
	returnsWithin5s(t, "a step-loop call waited for C", func() error {
		var err error
		if peer, err = c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor()); err != nil {
			return err
		}
		if again, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor()); err != nil || again != peer {
			return fmt.Errorf("the same metadata again: %+v, %v (first %+v)", again, err, peer)
		}
		if other, err = c.AddRemotePeer(q.AgentMetadata(), q.MemDescriptor()); err != nil {
			return err
		}
		if err := c.RemoveRemotePeer(other.Agent); err != nil { // before its load
			return err
		}
		h, err = c.PostRead([]int{1, 2}, peer.Agent, []int{5, 6}, []byte("s:h"))
		return err
	})
	if _, rs := c.fakeLeaksLocked(); rs != 0 {
		t.Fatalf("%d remote agents loaded while C was held", rs)
	}
	held = false
	c.cmu.Unlock()
	if pg := waitEnded(t, c, h); pg != xfer.Complete {
		t.Fatalf("READ to a peer that was loading: %v", pg)
	}
	if !bytes.Equal(cr.Block(1), pr.Block(5)) || !bytes.Equal(cr.Block(2), pr.Block(6)) {
		t.Fatal("bytes differ")
	}
	c.Release(h)
	// The peer removed before its load was never loaded; the other
	// holds two registrations.
	waitLeaks(t, c, 0, 1)
	for range 2 {
		if err := c.RemoveRemotePeer(peer.Agent); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RemoveRemotePeer(peer.Agent); !errors.Is(err, xfer.ErrUnknownPeer) {
		t.Fatalf("removed three times: %v", err)
	}
	waitLeaks(t, c, 0, 0)
}

// By default a load that fails ends the READs queued behind it
// Failed, saying why, and PostRead refuses later ones with xfer.ErrUnknownPeer,
// naming the cause; registering the metadata again loads it again.
func TestAsyncPeerLoadFails(t *testing.T) {
	c, _ := newAgent(t, variants[0], 8, 64, Config{})
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	c.cmu.Lock() // the failure is injected before the goroutine can load
	fakeFail(fakeLoad, -10, 1)
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		c.cmu.Unlock()
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	c.cmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Failed {
		t.Fatalf("READ behind a failed load: %v", pg)
	}
	if why := c.failedWhy(h); !errors.Is(why, errRemoteDisconnect) { // the load's failure, not a post refusal
		t.Errorf("the failed READ says %v, not the failed load", why)
	}
	if err := c.Release(h); err != nil {
		t.Fatal(err)
	}
	_, err = c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	if !errors.Is(err, xfer.ErrUnknownPeer) || !errors.Is(err, errRemoteDisconnect) {
		t.Fatalf("READ after the failed load: %v", err)
	}
	if err := c.RemoveRemotePeer(peer.Agent); err != nil {
		t.Fatal(err)
	}
	again, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil || again.Agent == peer.Agent {
		t.Fatalf("registered again: %+v, %v", again, err)
	}
	h, err = c.PostRead([]int{1}, again.Agent, []int{1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Complete {
		t.Fatalf("READ after loading again: %v", pg)
	}
	c.Release(h) // in C by the progress goroutine
	waitLeaks(t, c, 0, 1)
}

// waitLeaks waits until a holds hs requests and rs remote agents in C
// (the progress goroutine makes the calls that release them).
func waitLeaks(t *testing.T, a *Agent, hs, rs int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		h, r := a.fakeLeaks()
		if h == hs && r == rs {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d requests and %d remote agents held, want %d and %d", h, r, hs, rs)
		}
	}
}

// The step loop's calls never wait for the progress goroutine's own calls
// into C either: with it inside a progress call
// (which over UCX tcp moves bytes, and can take long), Check, PostRead,
// Release and DrainNotifs return.
func TestAsyncStepNeverWaitsForProgress(t *testing.T) {
	c, peer := slowPair(t, Config{})
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, []byte("s:h"))
	if err != nil {
		t.Fatal(err)
	}
	c.fakeHoldProgress(true)
	held := true
	defer func() {
		if held {
			c.fakeHoldProgress(false)
		}
	}()
	returnsWithin5s(t, "a step-loop call waited for a progress call in C", func() error {
		if _, err := c.Check(h); err != nil {
			return err
		}
		h2, err := c.PostRead([]int{2}, peer.Agent, []int{2}, nil)
		if err != nil {
			return err
		}
		if err := c.Release(h2); err != nil { // queued: dropped
			return err
		}
		_, err = c.DrainNotifs(nil)
		return err
	})
	held = false
	c.fakeHoldProgress(false)
	if pg := waitEnded(t, c, h); pg != xfer.Complete {
		t.Fatalf("READ: %v", pg)
	}
	c.Release(h)
	waitLeaks(t, c, 0, 1)
}

// A READ that never ends (a hung producer, a link that drops everything)
// costs the progress goroutine's pauses, not a core: under 5 % of a core
// over a second from its post, above the same process idle; then its
// pauses have grown to ProgressDelay. The process's CPU counts whatever
// else runs in it (the race detector, the collector, other packages'
// tests beside it on a small machine), so the best of three trials, each
// a READ of its own ended before the next, is judged: a goroutine that
// spun would fail all three.
func TestHungReadParks(t *testing.T) {
	fakeSetHang(true)
	defer fakeSetHang(false) // before the agents close
	c, peer := slowPair(t, Config{})
	const window = time.Second
	var trials []string
	parked := false
	for trial := 0; trial < 3 && !parked; trial++ {
		fakeSetHang(true)
		settle(t, c)
		idle := cpuOver(t, window)
		h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		hung := cpuOver(t, window)
		if pg, err := c.Check(h); pg != xfer.InProgress || err != nil {
			t.Fatalf("the READ was to hang: %v, %v", pg, err)
		}
		share := (hung - idle).Seconds() / window.Seconds()
		trials = append(trials, fmt.Sprintf("%.1f %% (%v over %v, %v idle)", 100*share, hung, window, idle))
		if parked = share <= 0.05; parked {
			wakeupsAtMost(t, c)
		}
		fakeSetHang(false)
		if pg := waitEnded(t, c, h); pg != xfer.Complete {
			t.Fatalf("READ: %v", pg)
		}
		c.Release(h)
	}
	if !parked {
		t.Fatalf("a hung READ cost over 5 %% of a core in every trial: %s", strings.Join(trials, "; "))
	}
	t.Logf("a hung READ: %s", strings.Join(trials, "; "))
}

// While a producer expects READs and none comes, its progress goroutine
// wakes often at first (a READ should come soon after its grant), then
// less and less, down to once per ProgressDelay (10 ms), not a thousand
// times a second.
func TestExpectedReadsPause(t *testing.T) {
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	p.expectReads(1)
	defer p.expectReads(0)
	wakeupsAtMost(t, p)
}

// A grant keeps the producer driven closely for a while; a peer's
// notifications do not. Once the newest grant is older than youngGrant, a
// notification neither resets the pauses' cap nor starts them again from
// their shortest: one trickled every 2 ms to a producer whose only grant
// (300 ms old) is never read costs it about the wake-ups the grant alone
// does, not one per notification and more.
func TestNotificationsDoNotKeepAGrantDriven(t *testing.T) {
	const every = 2 * time.Millisecond
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	c, _ := newAgent(t, variants[0], 8, 64, Config{SyncPost: true, Progress: ProgressCaller})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { // the peer: a notification naming no grant every 2 ms
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			c.connect(ctx, peer.Agent, fmt.Appendf(nil, "%s:%d", c.cfg.Name, i), wire.Blocks{})
			c.DrainNotifs(nil)
		}
	}()
	go func() { // the producer's session drains what comes
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.readyChan():
				p.DrainNotifs(nil)
			}
		}
	}()
	p.expectReads(1)
	defer p.expectReads(0)
	time.Sleep(300 * time.Millisecond)
	// The grant's own pauses over the first second: doubling from
	// grantPause to a twentieth of its age, never past ProgressDelay. A
	// later second allows fewer, so the bound holds for it too.
	var pauses uint64
	for at, wait := 300*time.Millisecond, time.Duration(0); at < 1300*time.Millisecond; pauses++ {
		wait = min(max(2*wait, grantPause), defaultProgressDelay, max(readPause, at/readLag))
		at += wait
	}
	most := pauses*3/2 + 9
	if n, ok := fewWakeups(p, time.Second, most); !ok {
		t.Fatalf("a live grant under a trickle of notifications: %v wake-ups in three seconds, want at most %d in one", n, most)
	} else {
		t.Logf("a live grant under a trickle of notifications: %v wake-ups in 1 s (at most %d)", n, most)
	}
}

// fewWakeups counts a's progress goroutine's wake-ups over up to three
// windows in a row, until one has at most most. One window is a single
// sample of a loaded machine (a progress call it slows past movedCall
// starts the pauses over); a goroutine that woke too often would exceed
// the bound in all three.
func fewWakeups(a *Agent, window time.Duration, most uint64) ([]uint64, bool) {
	var counts []uint64
	for range 3 {
		w0 := a.wakeups.Load()
		time.Sleep(window)
		n := a.wakeups.Load() - w0
		if counts = append(counts, n); n <= most {
			return counts, true
		}
	}
	return counts, false
}

// wakeupsAtMost fails the test if a's progress goroutine wakes more often
// over the next second than its pauses allow, while READs are outstanding
// (its own, or peers' of its grants): they double from 25 µs up to 1 ms,
// or a twentieth of the time since the last event if that is longer,
// never past ProgressDelay's default, and the timer never fires early.
// Half as many more allow for progress calls a loaded machine slows past
// movedCall, which start them over; the bound, counted from the first
// event, holds for any later window too (fewWakeups).
func wakeupsAtMost(t *testing.T, a *Agent) {
	t.Helper()
	const window = time.Second
	var pauses uint64
	for at, wait := time.Duration(0), time.Duration(0); ; pauses++ {
		wait = min(max(2*wait, firstPause), defaultProgressDelay, max(readPause, at/readLag))
		if at += wait; at > window {
			break
		}
	}
	most := pauses*3/2 + 9
	if n, ok := fewWakeups(a, window, most); !ok {
		t.Fatalf("%v wake-ups in three windows of %v, want at most %d in one", n, window, most)
	} else {
		t.Logf("%v wake-ups in %v (at most %d)", n, window, most)
	}
}

// cpuOver returns the CPU time (user and system) the process used over d.
func cpuOver(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	used := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	u0 := used()
	time.Sleep(d)
	return used() - u0
}

// A touch READ that never ends (a producer that stopped driving its agent
// after its contact answer) costs the consumer nothing: its progress
// goroutine is not driven for it, a second contact adds no second one,
// and Close waits for it only briefly and reports no READ stopped.
func TestHungTouchCostsNothing(t *testing.T) {
	fakeSetHang(true)
	defer fakeSetHang(false) // before the agents close
	c, _ := newAgent(t, variants[0], 8, 64, Config{})
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := plane.Contact{Touch: plane.TouchPageOf(p)}
	for range 2 {
		if err := plane.ContacterOf(c).Contact(ctx, peer.Agent, k); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	n := len(c.touches)
	c.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d touch READs under way, want the one that hangs", n)
	}
	const window = 500 * time.Millisecond
	w0 := c.wakeups.Load()
	time.Sleep(window)
	if w := c.wakeups.Load() - w0; w > uint64(3*window/c.cfg.IdlePoll) {
		t.Fatalf("the progress goroutine woke %d times in %v for a hung touch READ", w, window)
	}
	t0 := time.Now()
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if d := time.Since(t0); d > c.cfg.CloseTimeout/2 {
		t.Fatalf("close took %v", d)
	}
}

// A touch READ that never ends stands for its peer only while that agent
// is loaded: a producer removed and loaded again under the same name (a
// restart) gets a touch READ of its own at its contact. And Close, which
// waits for such a READ a while, keeps no DrainNotifs of a caller-driven
// agent waiting meanwhile.
func TestHungTouchOfARemovedPeer(t *testing.T) {
	fakeSetHang(true)
	defer fakeSetHang(false) // before the agents close
	c, _ := newAgent(t, variants[0], 8, 64, withPost("sync", Config{}))
	name := fmt.Sprintf("restarted-%d", seq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 2 {
		p, _ := newAgent(t, variants[0], 8, 64, Config{Name: name})
		peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		if err := plane.ContacterOf(c).Contact(ctx, peer.Agent, plane.Contact{Touch: plane.TouchPageOf(p)}); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		n := len(c.touches)
		c.mu.Unlock()
		if n != i+1 {
			t.Fatalf("incarnation %d: %d touch READs under way, want %d", i, n, i+1)
		}
		if err := c.RemoveRemotePeer(peer.Agent); err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	for {
		c.mu.Lock()
		started := c.closed
		c.mu.Unlock()
		if started {
			break
		}
		time.Sleep(time.Millisecond)
	}
	t0 := time.Now()
	if _, err := c.DrainNotifs(nil); !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("DrainNotifs while closing: %v", err)
	}
	if d := time.Since(t0); d > touchCloseWait/2 {
		t.Fatalf("DrainNotifs waited %v for Close", d)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// A peer's notifications, sent as fast as it can, do not keep the
// progress goroutine spinning while a READ of ours hangs: no more of them
// count as work than grants are live, however many there were before (see
// TestPeerNotificationsDoNotKeepUsSpinning). Here 65,536 grants were made
// and all but one ended.
func TestPeerNotificationsDoNotSpinAHungRead(t *testing.T) {
	fakeSetHang(true)
	defer fakeSetHang(false) // before the agents close
	a, peer := slowPair(t, Config{})
	a.expectReads(65536)
	a.expectReads(1)
	defer a.expectReads(0)
	if c := a.credit.Load(); c > 1 {
		t.Fatalf("with one grant live, %d notifications may count as work", c)
	}
	if _, err := a.PostRead([]int{1}, peer.Agent, []int{1}, nil); err != nil {
		t.Fatal(err)
	}
	floodSpinsLittle(t, a, nil)
}
