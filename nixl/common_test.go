//go:build nixl || nixlfake

package nixl

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

// variant is one way of running agents: a UCX transport for real NIXL, or
// the C fake.
type variant struct {
	name   string
	tls    string // UCX_TLS; "" leaves it unset
	params map[string]string
	setup  func(t *testing.T) // more of the variant's set-up, if any
	inline bool               // its READs complete within their post
}

var seq atomic.Int64

func (v variant) env(t *testing.T) {
	t.Helper()
	if v.tls != "" {
		t.Setenv("UCX_TLS", v.tls)
	}
	if v.setup != nil {
		v.setup(t)
	}
}

// newAgent makes an agent of v over a fresh region; both close with the
// test, the agent first.
func newAgent(t *testing.T, v variant, blocks, size int, cfg Config) (*Agent, *cache.Region) {
	t.Helper()
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: size, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("agent-%d", seq.Add(1))
	}
	if cfg.Params == nil {
		cfg.Params = v.params
	}
	a, err := New(cfg, r)
	if err != nil {
		r.Close()
		needNIXL(t, err)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close() // before the region goes: nothing may write into it after
		r.Close()
	})
	return a, r
}

func forVariants(t *testing.T, f func(t *testing.T, v variant)) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			v.env(t)
			f(t, v)
		})
	}
}

// postModes are where PostRead's READs are posted: in the step, waiting
// for C (SyncPost); by default, in the step when C is free and the READ
// small, else by the progress goroutine; and always by the goroutine.
var postModes = []struct {
	name string
	set  func(*Config)
}{
	{"sync", func(c *Config) { c.SyncPost = true }},
	{"auto", func(c *Config) {}},
	{"async", func(c *Config) { c.InlinePost = -1 }},
}

func withPost(mode string, c Config) Config {
	for _, m := range postModes {
		if m.name == mode {
			m.set(&c)
			return c
		}
	}
	panic("no post mode " + mode)
}

func TestConformance(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		for _, m := range postModes {
			t.Run("post="+m.name, func(t *testing.T) {
				xfertest.Conformance(t, func(t *testing.T) xfertest.Pair {
					c, cr := newAgent(t, v, 128, 256, withPost(m.name, Config{}))
					p, pr := newAgent(t, v, 128, 256, withPost(m.name, Config{}))
					return xfertest.Pair{Consumer: c, Producer: p, ConsumerBlock: cr.Block, ProducerBlock: pr.Block, Blocks: 128}
				})
			})
		}
	})
}

// Every id must name a block of its region and fit NIXL's int32: nothing
// outside is posted, and nothing is left held.
func TestPostReadChecksIDs(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		c, _ := newAgent(t, v, 8, 64, Config{})
		p, _ := newAgent(t, v, 16, 64, Config{})
		peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		if peer.Blocks != 16 {
			t.Fatalf("peer %+v", peer)
		}
		bad := []struct{ local, remote []int }{
			{[]int{8}, []int{0}},             // past the local region
			{[]int{-1}, []int{0}},            // negative
			{[]int{1<<32 + 1}, []int{0}},     // wraps to 1 in int32
			{[]int{0}, []int{16}},            // past the remote region
			{[]int{0}, []int{-1}},            // negative remote
			{[]int{0}, []int{1<<32 + 1}},     // wraps remotely
			{[]int{0}, []int{math.MaxInt32}}, // in int32, outside the peer
			{[]int{}, []int{}},               // nothing to read
		}
		for _, b := range bad {
			if _, err := c.PostRead(b.local, peer.Agent, b.remote, []byte("s:h")); !errors.Is(err, errInvalidParam) {
				t.Errorf("PostRead(%v, %v): %v, want errInvalidParam", b.local, b.remote, err)
			}
		}
		c.mu.Lock()
		held := len(c.handles)
		c.mu.Unlock()
		if held != 0 {
			t.Fatalf("%d handles held after refused posts", held)
		}
	})
}

// Closing an agent with READs in flight returns, and nothing writes into
// its blocks afterwards (canaries written after Close stay).
func TestCloseWithReadsInFlight(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		for round := range 5 {
			const blocks, size = 64, 64 << 10
			c, cr := newAgent(t, v, blocks, size, Config{CloseTimeout: time.Second})
			p, pr := newAgent(t, v, blocks, size, Config{})
			p.expectReads(1) // the producer keeps moving bytes
			for i := range blocks {
				xfertestFill(pr.Block(i), byte(i))
			}
			peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
			if err != nil {
				t.Fatal(err)
			}
			for i := range blocks / 4 {
				ids := []int{4 * i, 4*i + 1, 4*i + 2, 4*i + 3}
				if _, err := c.PostRead(ids, peer.Agent, ids, []byte("s:close")); err != nil {
					t.Fatal(err)
				}
			}
			if round%2 == 1 {
				time.Sleep(time.Duration(round) * 100 * time.Microsecond)
			}
			if err := c.Close(); err != nil {
				t.Logf("round %d: %v", round, err)
			}
			canary := bytes.Repeat([]byte{0xA5}, size)
			for i := range blocks {
				copy(cr.Block(i), canary)
			}
			time.Sleep(20 * time.Millisecond) // the producer goes on being driven
			for i := range blocks {
				if !bytes.Equal(cr.Block(i), canary) {
					t.Fatalf("round %d: block %d written after Close", round, i)
				}
			}
			if _, err := c.PostRead([]int{0}, peer.Agent, []int{0}, nil); !errors.Is(err, xfer.ErrClosed) {
				t.Fatalf("post after close: %v", err)
			}
		}
	})
}

// A producer told to expect READs moves them with nobody else driving it:
// the consumer only checks, the producer's loop never drains.
func TestExpectReadsDrivesTheProducer(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		c, cr := newAgent(t, v, 16, 1<<20, Config{})
		p, pr := newAgent(t, v, 16, 1<<20, Config{IdlePoll: time.Hour})
		for i := range 16 {
			xfertestFill(pr.Block(i), byte(i))
		}
		peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		p.expectReads(1)
		ids := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
		h, err := c.PostRead(ids, peer.Agent, ids, []byte("s:expect"))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			pg, err := c.Check(h)
			if err != nil {
				t.Fatal(err)
			}
			if pg == xfer.Complete {
				break
			}
			if pg == xfer.Failed || time.Now().After(deadline) {
				t.Fatalf("READ %s", pg)
			}
			time.Sleep(50 * time.Microsecond)
		}
		for i := range 16 {
			if !bytes.Equal(cr.Block(i), pr.Block(i)) {
				t.Fatalf("block %d differs", i)
			}
		}
		c.Release(h)
		// The goroutine collected the notification and signals it.
		select {
		case <-p.readyChan():
		case <-time.After(5 * time.Second):
			t.Fatal("no readiness signal for the notification")
		}
		got, err := p.DrainNotifs(nil)
		if err != nil || len(got) != 1 || string(got[0].Msg) != "s:expect" {
			t.Fatalf("notifications %+v", got)
		}
	})
}

func xfertestFill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed ^ byte(i*7) ^ byte(i>>8)
	}
}

// Consumer and producer sessions over two agents: a hundred fetches, every
// byte checked, every pin released, no handle or remote agent left.
// It runs under each progress mode.
func TestSessionsOverAgents(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		for _, mode := range []Progress{ProgressGoroutine, ProgressThread, ProgressCaller} {
			t.Run(mode.String(), func(t *testing.T) { sessionsOverAgents(t, v, mode, "auto") })
		}
		for _, post := range []string{"sync", "async"} {
			t.Run("goroutine-"+post, func(t *testing.T) { sessionsOverAgents(t, v, ProgressGoroutine, post) })
		}
	})
}

func sessionsOverAgents(t *testing.T, v variant, mode Progress, post string) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cdata, cr := newAgent(t, v, 64, 4096, withPost(post, Config{Progress: mode}))
	pdata, pr := newAgent(t, v, 256, 4096, Config{Progress: mode})
	entries := cache.NewEmbeddingCache(256)
	held := map[int][]int{}
	for i := range 100 {
		e, _ := entries.Alloc(fmt.Sprint(i), 2)
		held[i] = e.Blocks
		for j, b := range e.Blocks {
			xfertestFill(pr.Block(b), byte(i*2+j))
		}
		entries.MarkReady(fmt.Sprint(i))
	}
	link := &memLink{}
	cons, err := session.NewConsumerSession(session.ConsumerConfig{Logger: quiet}, link, cdata, "compat")
	if err != nil {
		t.Fatal(err)
	}
	prod := must(session.NewProducerSession(session.ProducerConfig{Logger: quiet}, pdata, entries, "compat"))
	var r session.Results
	for i := range 100 {
		now := time.Now()
		local := []int{(2 * i) % 64, (2*i + 1) % 64}
		if err := cons.StartXfer(fmt.Sprint(i), local, now.Add(time.Minute), now); err != nil {
			t.Fatal(err)
		}
		for step := 0; cons.InFlight() > 0; step++ {
			if step > 200000 {
				t.Fatalf("fetch %d did not end", i)
			}
			link.step(prod, cons)
			cons.TakeResults(&r)
			time.Sleep(20 * time.Microsecond)
		}
		for j, b := range local {
			if !bytes.Equal(cr.Block(b), pr.Block(held[i][j])) {
				t.Fatalf("fetch %d block %d: bytes differ", i, j)
			}
		}
	}
	if len(r.Completed) != 100 || r.Len() != 100 {
		t.Fatalf("results %+v", r)
	}
	for end := time.Now().Add(5 * time.Second); prod.Grants() > 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
		prod.Poll(nil, link, time.Now())
	}
	if prod.Grants() != 0 || heldEntries(entries) {
		t.Fatalf("%d grants left", prod.Grants())
	}
	if pdata.expect.Load() != 0 {
		t.Fatalf("producer still expects %d READs", pdata.expect.Load())
	}
	cons.Close()
	cdata.mu.Lock()
	h, peers := len(cdata.handles), len(cdata.peers)
	cdata.mu.Unlock()
	if h != 0 || peers != 0 {
		t.Fatalf("consumer holds %d requests, %d remotes", h, peers)
	}
}

// memLink is an in-memory control plane between one consumer session and
// one producer session.
type memLink struct{ toP, toC [][]byte }

func (l *memLink) Send(b []byte) error     { l.toP = append(l.toP, bytes.Clone(b)); return nil }
func (l *memLink) Reply(_, b []byte) error { l.toC = append(l.toC, bytes.Clone(b)); return nil }

// step runs the producer on the requests sent, then the consumer on the
// replies, at the wall clock.
func (l *memLink) step(prod *session.ProducerSession, cons *session.ConsumerSession) {
	var msgs []xfer.Message
	for _, m := range l.toP {
		msgs = append(msgs, xfer.Message{Identity: []byte("c"), Payload: m})
	}
	l.toP = nil
	prod.Poll(msgs, l, time.Now())
	cons.Poll(l.toC, time.Now())
	l.toC = nil
}

// The re-fetch workload over NIXL: one consumer session re-fetches a few entries at
// high concurrency, so a re-request often arrives while the previous
// grant's notification is still on its way. Every fetch completes with the
// producer's bytes, and every grant ends once, by its own READ's
// notification (the ack's grant id names it) or its lease.
func TestRefetchSameEntries(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		const entries, inFlight, fetches = 8, 16, 1500
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		cdata, cr := newAgent(t, v, 2*inFlight, 4096, Config{})
		pdata, pr := newAgent(t, v, 8*entries, 4096, Config{})
		cache := cache.NewEmbeddingCache(8 * entries)
		want := map[string][]byte{}
		for i := range entries {
			h := fmt.Sprint("img-", i)
			e, _ := cache.Alloc(h, 2)
			for j, b := range e.Blocks {
				xfertestFill(pr.Block(b), byte(i*2+j+1))
			}
			want[h] = append(bytes.Clone(pr.Block(e.Blocks[0])), pr.Block(e.Blocks[1])...)
			cache.MarkReady(h)
		}
		link := &memLink{}
		cons, err := session.NewConsumerSession(session.ConsumerConfig{Logger: quiet}, link, cdata, "compat")
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		// The loop below spins, on two CPUs here, while the agents'
		// progress goroutines drain the notifications: a re-request can
		// find more than the default eight earlier grants of its entry
		// waiting for theirs, and be answered NACK_NOT_READY. That bound
		// is not under test.
		prod := must(session.NewProducerSession(session.ProducerConfig{Logger: quiet, MaxGrantsPerEntry: fetches}, pdata, cache, "compat"))
		free := make([]int, 2*inFlight)
		for i := range free {
			free[i] = i
		}
		busy := map[string]bool{}
		started, done := 0, 0
		var r session.Results
		for deadline := time.Now().Add(2 * time.Minute); done < fetches; {
			if time.Now().After(deadline) {
				t.Fatalf("stuck after %d of %d fetches", done, fetches)
			}
			for started < fetches && len(free) >= 2 {
				h := fmt.Sprint("img-", (started*7)%entries)
				if busy[h] {
					break
				}
				now := time.Now()
				if err := cons.StartXfer(h, slices.Clone(free[len(free)-2:]), now.Add(time.Minute), now); err != nil {
					t.Fatal(err)
				}
				free = free[:len(free)-2]
				busy[h] = true
				started++
			}
			link.step(prod, cons)
			r.Reset()
			cons.TakeResults(&r)
			if r.Len() != len(r.Completed) {
				t.Fatalf("fetch did not complete: %+v\nproducer: %+v\nconsumer: %+v", r, prod.Stats(), cons.Stats())
			}
			for _, o := range r.Completed {
				got := append(bytes.Clone(cr.Block(o.Blocks[0])), cr.Block(o.Blocks[1])...)
				if !bytes.Equal(got, want[o.MMHash]) {
					t.Fatalf("%s completed with other bytes", o.MMHash)
				}
				free = append(free, o.Blocks...)
				delete(busy, o.MMHash)
				done++
			}
		}
		for end := time.Now().Add(5 * time.Second); prod.Grants() > 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
			prod.Poll(nil, link, time.Now())
		}
		st := prod.Stats()
		if prod.Grants() != 0 || st.Grants != st.Completions+st.Expired || st.Expired != 0 || heldEntries(cache) {
			t.Fatalf("grants %d, completions %d, expired %d, live %d", st.Grants, st.Completions, st.Expired, prod.Grants())
		}
		t.Logf("%d fetches: %d grants, %d re-requests, %d completions", fetches, st.Grants, st.ReRequests, st.Completions)
	})
}

// must returns v, panicking on err: for constructors in tests.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A READ that completes within its post (UCX over shared memory copies
// there; the fake's inline variant does the same) is recorded ended with
// its post: Ready signals it as any READ that ends, and the next Check says
// Complete, with the bytes there. Posted in the step (SyncPost, or by
// default a small READ while C is free) it is recorded before PostRead
// returns; posted by the progress goroutine PostRead returns first.
// Variants that say so must complete within the post; a real UCX may or
// may not (the bundled one does over sm), and the test logs which.
func TestReadDoneWithinPost(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		for _, m := range postModes {
			t.Run("post="+m.name, func(t *testing.T) { readDoneWithinPost(t, v, m.name) })
		}
	})
}

func readDoneWithinPost(t *testing.T, v variant, post string) {
	const n, bs = 16, 8192
	p, pr := newAgent(t, v, n, bs, Config{})
	c, cr := newAgent(t, v, n, bs, withPost(post, Config{IdlePoll: time.Hour}))
	for i := range n {
		xfertestFill(pr.Block(i), byte(i))
	}
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	p.expectReads(1)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	var h xfer.Handle
	async := post == "async"
	if post == "auto" {
		// The READ (128 KiB) is posted in the step once its peer is
		// loaded and C is free: wait for that. The progress goroutine may
		// take C in a round of its own just then, and the READ is handed
		// off; it is let end and the post tried again.
		for try := 0; ; try++ {
			if try == 20 {
				t.Fatal("20 small READs with C free were all handed to the progress goroutine")
			}
			settle(t, c)
			var handed atomic.Bool
			c.beforePost = func() { handed.Store(true) }
			if h, err = c.PostRead(ids, peer.Agent, ids, []byte("s:inline")); err != nil {
				t.Fatal(err)
			}
			c.mu.Lock()
			queued := c.handles[h].phase != posted
			c.mu.Unlock()
			if !queued && !handed.Load() {
				break
			}
			t.Logf("READ %d handed off", try)
			waitEnded(t, c, h)
			if err := c.Release(h); err != nil {
				t.Fatal(err)
			}
		}
	} else if h, err = c.PostRead(ids, peer.Agent, ids, []byte("s:inline")); err != nil {
		t.Fatal(err)
	}
	ended := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.handles[h].ended
	}
	if async {
		// The progress goroutine posts it, and signals if it ended there.
		select {
		case <-c.readyChan():
		case <-time.After(5 * time.Second):
			t.Fatal("no readiness signal for a READ posted by the progress goroutine")
		}
		for !ended() && v.inline { // a round that saw nothing new may signal first
			select {
			case <-c.readyChan():
			case <-time.After(5 * time.Second):
				t.Fatal("READ not recorded ended 5 s after its post")
			}
		}
	}
	inline := ended()
	t.Logf("READ recorded ended (within its post, if inline): %v", inline)
	if v.inline && !inline {
		t.Fatal("READ not recorded done within its post")
	}
	if inline && !async {
		select {
		case <-c.readyChan():
		case <-time.After(5 * time.Second):
			t.Fatal("no readiness signal for a READ done within its post")
		}
		if pg, err := c.Check(h); pg != xfer.Complete || err != nil {
			t.Fatalf("first Check: %v, %v", pg, err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Microsecond) {
		pg, err := c.Check(h)
		if err != nil || pg == xfer.Failed || time.Now().After(deadline) {
			t.Fatalf("READ: %v, %v", pg, err)
		}
		if pg == xfer.Complete {
			break
		}
	}
	if err := c.Release(h); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !bytes.Equal(cr.Block(i), pr.Block(i)) {
			t.Fatalf("block %d differs", i)
		}
	}
}

// BenchmarkAddRemotePeer measures what registering a producer of 16,384
// blocks costs the step that took its ack: checking its descriptor, and
// NIXL's loadRemoteMD with SyncPost or, by default, a queued load (the
// progress goroutine loads it, before that producer's READs). Each op adds
// the same producer again and, untimed, removes it: UCX's connection to
// it is up, so NIXL's load costs less than on a first contact.
//
//	go test -tags nixl -run '^$' -bench AddRemotePeer ./nixl/
func BenchmarkAddRemotePeer(b *testing.B) {
	for _, v := range variants {
		for _, post := range []string{"sync", "auto"} {
			b.Run(fmt.Sprintf("%s/post=%s", v.name, post), func(b *testing.B) {
				if v.tls != "" {
					b.Setenv("UCX_TLS", v.tls)
				}
				var agents [2]*Agent
				for i := range agents {
					r, err := cache.NewRegion(cache.RegionConfig{Blocks: 16384, BlockSize: 4096, NoLock: true})
					if err != nil {
						b.Fatal(err)
					}
					cfg := Config{Name: fmt.Sprintf("bench-%d", seq.Add(1)), Params: v.params}
					if i == 0 {
						cfg = withPost(post, cfg)
					}
					a, err := New(cfg, r)
					if err != nil {
						r.Close()
						// As needNIXL: no NIXL skips, except in CI; any
						// other error fails.
						if (errors.Is(err, ErrNotInstalled) || errors.Is(err, ErrNotBuilt)) && os.Getenv("CI") != "true" {
							b.Skipf("no NIXL in this build: %v", err)
						}
						b.Fatal(err)
					}
					b.Cleanup(func() { a.Close(); r.Close() })
					agents[i] = a
				}
				c, p := agents[0], agents[1]
				for b.Loop() {
					peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := c.RemoveRemotePeer(peer.Agent); err != nil {
						b.Fatal(err)
					}
					if post != "sync" { // its load and removal done, not left to the next op
						c.cmu.Lock()
						c.postQueued()
						c.cmu.Unlock()
					}
					b.StartTimer()
				}
			})
		}
	}
}

// settle waits until a's progress goroutine has made the calls queued for
// it and waits (idle, or in its pause), holding no lock.
func settle(t *testing.T, a *Agent) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		a.mu.Lock()
		todo := len(a.peerOps) + len(a.queued)
		a.mu.Unlock()
		if todo == 0 && a.parked.Load() {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("progress goroutine not idle 5 s on (%d calls queued)", todo)
		}
	}
}

// waitEnded waits on Ready until Check says h ended.
func waitEnded(t *testing.T, a *Agent, h xfer.Handle) xfer.Progress {
	t.Helper()
	for {
		pg, err := a.Check(h)
		if err != nil {
			t.Fatal(err)
		}
		if pg != xfer.InProgress {
			// The rule: a READ NIXL failed says why (plane.Explainer).
			if why := a.failedWhy(h); (pg == xfer.Failed) != (why != nil) {
				t.Errorf("READ %d is %v; why it failed: %v", h, pg, why)
			}
			return pg
		}
		select {
		case <-a.readyChan():
		case <-time.After(5 * time.Second):
			t.Fatal("READ not ended after 5 s")
		}
	}
}

// A producer registered from its region's shape reads as one registered
// from its descriptor (the two share the load); a shape that cannot be a
// region is refused before anything reaches C.
func TestAddRemotePeerShape(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		const n, bs = 8, 4096
		p, pr := newAgent(t, v, n, bs, Config{})
		c, cr := newAgent(t, v, n, bs, Config{})
		for i := range n {
			xfertestFill(pr.Block(i), byte(i+1))
		}
		shape, regular, err := wire.DecodeBlocks(p.MemDescriptor())
		if err != nil || !regular || shape.Count != n {
			t.Fatalf("own descriptor: %+v, %v, %v", shape, regular, err)
		}
		peer, err := c.addRemotePeerShape(p.AgentMetadata(), shape)
		if err != nil || peer.Blocks != n {
			t.Fatalf("AddRemotePeerShape: %+v, %v", peer, err)
		}
		again, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
		if err != nil || again != peer {
			t.Fatalf("the descriptor after the shape: %+v, %v (first %+v)", again, err, peer)
		}
		p.expectReads(1)
		ids := []int{0, 1, 2, 3, 4, 5, 6, 7}
		h, err := c.PostRead(ids, peer.Agent, ids, []byte("s:shape"))
		if err != nil {
			t.Fatal(err)
		}
		if pg := waitEnded(t, c, h); pg != xfer.Complete {
			t.Fatalf("READ %v", pg)
		}
		c.Release(h)
		p.expectReads(0)
		for i := range n {
			if !bytes.Equal(cr.Block(i), pr.Block(i)) {
				t.Fatalf("block %d differs", i)
			}
		}
		for _, bad := range []wire.Blocks{
			{Base: shape.Base, Size: 0, Count: n},
			{Base: shape.Base, Size: bs, Count: 0},
			{Base: shape.Base, Size: bs, Count: -1},
			{Base: math.MaxUint64 - bs, Size: bs, Count: 2},
			{Base: shape.Base, Size: 1, Count: math.MaxInt32 + 1},
		} {
			if _, err := c.addRemotePeerShape(p.AgentMetadata(), bad); !errors.Is(err, errInvalidParam) {
				t.Errorf("shape %+v: %v, want errInvalidParam", bad, err)
			}
		}
		if _, err := c.addRemotePeerShape(nil, shape); !errors.Is(err, errInvalidParam) {
			t.Errorf("no metadata: %v", err)
		}
	})
}

// heldEntries reports whether any entry of c is not ready or pinned.
func heldEntries(c *cache.EmbeddingCache) bool {
	st := c.Stats()
	return st.NotReady > 0 || st.Pinned > 0
}
