package session

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// metaData is a fake data plane whose agent metadata can change, as on a
// producer restart.
type metaData struct {
	*xfake.Fake
	meta []byte
}

func (m *metaData) AgentMetadata() []byte { return m.meta }

// The descriptor goes out only until the consumer session has completed a
// READ, and again after our agent metadata changed.
func TestDescriptorOncePerSession(t *testing.T) {
	po := newProducer(t)
	data := &metaData{Fake: po.data, meta: po.data.AgentMetadata()}
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, data, po.cache, compat))
	s1, s2 := sid("one"), sid("two")
	acks := po.poll(t, t0, req("R", s1), req("R", s2))
	if len(acks) != 2 || len(acks[0].MemDescriptor) == 0 || len(acks[1].MemDescriptor) == 0 {
		t.Fatalf("first acks: %+v", acks)
	}
	// Until s1 completes a READ, it still gets the descriptor.
	acks = po.poll(t, at(time.Second), req("R", s1))
	if len(acks[0].MemDescriptor) == 0 {
		t.Fatal("descriptor left out before any completion")
	}
	po.data.InjectNotif("cons", []byte(s1+":R"))
	po.poll(t, at(2*time.Second))
	acks = po.poll(t, at(3*time.Second), req("R", s1), req("R", s2))
	if len(acks[0].MemDescriptor) != 0 || len(acks[1].MemDescriptor) == 0 {
		t.Fatalf("after s1's completion: s1 desc %d bytes, s2 desc %d bytes", len(acks[0].MemDescriptor), len(acks[1].MemDescriptor))
	}
	if len(acks[0].AgentMetadata) == 0 {
		t.Fatal("metadata left out")
	}
	// The agent restarts: everyone gets the descriptor again.
	data.meta = []byte("fake:prod:7:16")
	acks = po.poll(t, at(4*time.Second), req("R", s1))
	if len(acks[0].MemDescriptor) == 0 || string(acks[0].AgentMetadata) != "fake:prod:7:16" {
		t.Fatalf("after a restart: %+v", acks[0])
	}
}

// A request that offers to take a shape gets the region's shape for the
// descriptor, until the same completion; a request that does not, and any
// request to a producer whose descriptor is not a shape (the TCP plane's
// is empty), gets the descriptor.
func TestShapeForDescriptor(t *testing.T) {
	po := newProducer(t)
	s1, s2 := sid("one"), sid("two")
	offer := func(h, sid string) []byte {
		return wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: sid, AcceptsShape: true})
	}
	want, _, _ := wire.DecodeBlocks(po.data.MemDescriptor())
	acks := po.poll(t, t0, offer("R", s1), req("R", s2), offer("R", s1))
	for i, a := range acks {
		if shaped := i != 1; len(a.MemDescriptor) == 0 != shaped || shaped && a.Shape != want || !shaped && a.Shape.Count != 0 {
			t.Fatalf("ack %d: descriptor %d bytes, shape %+v (want %+v)", i, len(a.MemDescriptor), a.Shape, want)
		}
	}
	if st := po.p.Stats(); st.ShapesSent != 2 || st.DescsSent != 1 {
		t.Fatalf("shapes sent %d, descriptors %d", st.ShapesSent, st.DescsSent)
	}
	po.data.InjectNotif("cons", []byte(s1+":R"))
	po.poll(t, at(time.Second))
	if a := po.poll(t, at(2*time.Second), offer("R", s1))[0]; a.Shape.Count != 0 || len(a.MemDescriptor) != 0 {
		t.Fatalf("after s1's completion: %+v", a)
	}

	irregular := &descData{Fake: po.data, desc: wire.AppendMemDescs(nil, nil)}
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, irregular, po.cache, compat))
	if a := po.poll(t, at(3*time.Second), offer("R", s2))[0]; a.Shape.Count != 0 || len(a.MemDescriptor) != 1 {
		t.Fatalf("an empty descriptor: %+v", a)
	}
}

// descData is a fake data plane with another descriptor.
type descData struct {
	*xfake.Fake
	desc []byte
}

func (d *descData) MemDescriptor() []byte { return d.desc }

// plainData hides the fake's plane.ShapedPeers, as a data plane without it.
type plainData struct{ xfer.DataTransport }

// Our consumer, like the reference's, registers a producer once per
// metadata blob and needs the descriptor only then: descriptor-less acks
// after the first completion still complete. A consumer whose data plane
// takes shapes registers from the shape, and no descriptor is sent.
func TestConsumerWithDescriptorLessAcks(t *testing.T) {
	for _, shapes := range []bool{false, true} {
		t.Run(fmt.Sprint("shapes=", shapes), func(t *testing.T) { testDescriptorLessAcks(t, shapes) })
	}
}

func testDescriptorLessAcks(t *testing.T, shapes bool) {
	fab := xfake.NewFabric()
	var cdata xfer.DataTransport = fab.New("cons", 64, 16)
	pdata := fab.New("prod", 64, 16)
	if !shapes {
		cdata = plainData{cdata}
	}
	pc := cache.NewEmbeddingCache(64)
	for _, h := range []string{"a", "b", "c"} {
		pc.Alloc(h, 2)
		pc.MarkReady(h)
	}
	toP, toC := &queue{}, &queue{}
	cons, _ := NewConsumerSession(ConsumerConfig{Logger: quiet}, toP, cdata, compat)
	prod := must(NewProducerSession(ProducerConfig{Logger: quiet}, pdata, pc, compat))
	var r Results
	for i, h := range []string{"a", "b", "c"} {
		mustStart(t, cons, h, []int{2 * i, 2*i + 1}, at(time.Hour))
		for range 3 {
			var in []xfer.Message
			for _, m := range toP.take() {
				in = append(in, xfer.Message{Identity: []byte("c"), Payload: m})
			}
			prod.Poll(in, toC, at(time.Duration(i)*time.Second))
			cons.Poll(toC.take(), at(time.Duration(i)*time.Second))
		}
		cons.TakeResults(&r)
	}
	st := prod.Stats()
	if sent := map[bool]uint64{false: st.DescsSent, true: st.ShapesSent}; len(r.Completed) != 3 || sent[shapes] != 1 || sent[!shapes] != 0 || cons.Stats().Registrations != 1 {
		t.Fatalf("completed %d, descriptors sent %d, shapes %d, registrations %d", len(r.Completed), st.DescsSent, st.ShapesSent, cons.Stats().Registrations)
	}
}

// A session over its bound is refused for good (NACK_INTERNAL); a request
// that finds the table full of grants of identities each within their
// share is retryable (NACK_NOT_READY): they end within a lease.
func TestGrantBounds(t *testing.T) {
	po := newProducer(t)
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, MaxGrantsPerSession: 2, MaxGrants: 3}, po.data, po.cache, compat))
	po.cache.Alloc("S", 1)
	po.cache.MarkReady("S")
	po.cache.Alloc("T", 1)
	po.cache.MarkReady("T")
	a := sid("a")
	acks := po.poll(t, t0, req("R", a), req("S", a), req("T", a), req("R", a))
	want := []wire.Status{wire.OK, wire.OK, wire.NackInternal, wire.NackInternal} // a re-request is a grant too
	for i, ack := range acks {
		if ack.Status != want[i] {
			t.Fatalf("ack %d: %s, want %s", i, ack.Status, want[i])
		}
	}
	acks = po.poll(t, t0, req("T", sid("b")), req("S", sid("c")))
	if acks[0].Status != wire.OK || acks[1].Status != wire.NackNotReady || po.p.Stats().OverBound != 3 || po.p.Grants() != 3 {
		t.Fatalf("%s %s, refused %d, grants %d", acks[0].Status, acks[1].Status, po.p.Stats().OverBound, po.p.Grants())
	}
}

func TestMalformedSessionIDs(t *testing.T) {
	for _, id := range []string{"s", "3F2B8C1E-9A4D-4E7B-8C2F-1D5E6A7B8C9D", "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9", "3f2b8c1e:9a4d-4e7b-8c2f-1d5e6a7b8c9d",
		"3f2b8c1e9a4d4e7b8c2f1d5e6a7b8c9d0000", "{3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9}", "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9g"} {
		po := newProducer(t)
		acks := po.poll(t, t0, req("R", id))
		if acks[0].Status != wire.NackInternal || po.pins("R") != 0 || po.p.Stats().BadSessionIDs != 1 {
			t.Errorf("%q: %s", id, acks[0].Status)
		}
	}
	po := newProducer(t)
	if acks := po.poll(t, t0, req("R", "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9d")); acks[0].Status != wire.OK {
		t.Fatalf("canonical id refused: %s", acks[0].Status)
	}
}

func TestAuthorize(t *testing.T) {
	po := newProducer(t)
	po.poll(t, t0, req("R", sid("a")))
	e, _ := po.cache.Get("R")
	key := []byte(sid("a") + ":R")
	auth := func(agent string, notif []byte, blocks []int) bool {
		release, ok := po.p.authorizeRelease(agent, notif, blocks)
		if ok {
			release()
		}
		return ok
	}
	if !auth("cons", key, e.Blocks) || !auth("cons", key, e.Blocks[:1]) || !auth("cons", key, []int{e.Blocks[1], e.Blocks[0]}) {
		t.Fatal("granted blocks refused")
	}
	if auth("cons", key, []int{e.Blocks[0], 15}) || auth("cons", []byte(sid("b")+":R"), e.Blocks) {
		t.Fatal("ungranted READ authorized")
	}
	po.data.InjectNotif("cons", key)
	po.poll(t, at(time.Second))
	if auth("cons", key, e.Blocks) {
		t.Fatal("authorized after completion")
	}
}

// A request naming its agent binds the grant: another agent can neither
// read under it nor end it, and the grant id in the notification picks the
// grant exactly.
func TestGrantBoundToAgent(t *testing.T) {
	po := newProducer(t)
	r := wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: sid("a"), Agent: "cons-a"}
	acks := po.poll(t, t0, wire.AppendReq(nil, &r))
	if acks[0].Status != wire.OK || acks[0].Grant == 0 || acks[0].LeaseMillis != uint64(xfer.Config{}.WithDefaults().PinLease.Milliseconds()) {
		t.Fatalf("ack %+v", acks[0])
	}
	e, _ := po.cache.Get("R")
	notif := []byte(fmt.Sprintf("%s:R#%d", sid("a"), acks[0].Grant))
	if _, ok := po.p.authorizeRelease("thief", notif, e.Blocks); ok {
		t.Fatal("READ by another agent authorized")
	}
	if _, ok := po.p.authorizeRelease("cons-a", []byte(fmt.Sprintf("%s:R#%d", sid("a"), acks[0].Grant+1)), e.Blocks); ok {
		t.Fatal("READ under a grant id never given authorized")
	}
	po.data.InjectNotif("thief", notif)
	po.poll(t, at(time.Millisecond))
	if po.pins("R") != 1 || po.p.Stats().ForeignNotifs != 1 {
		t.Fatalf("a foreign notification ended the grant: pins %d, stats %+v", po.pins("R"), po.p.Stats())
	}
	// The session is bound: the same session id claiming another agent is refused.
	r2 := r
	r2.Agent = "thief"
	if acks := po.poll(t, at(2*time.Millisecond), wire.AppendReq(nil, &r2)); acks[0].Status != wire.NackInternal {
		t.Fatalf("second agent for the session: %s", acks[0].Status)
	}
	po.data.InjectNotif("cons-a", notif)
	po.poll(t, at(3*time.Millisecond))
	if po.pins("R") != 0 || po.p.Stats().Completions != 1 {
		t.Fatalf("the bound agent's notification did not end the grant: pins %d", po.pins("R"))
	}
}

// A READ being served keeps its entry pinned past the end of its grant
// (lease or Close), until the data plane releases it.
func TestServedReadHoldsThePin(t *testing.T) {
	po := newProducer(t)
	po.poll(t, t0, req("R", sid("a")))
	e, _ := po.cache.Get("R")
	release, ok := po.p.authorizeRelease("cons", []byte(sid("a")+":R"), e.Blocks)
	if !ok {
		t.Fatal("refused")
	}
	po.poll(t, at(time.Hour)) // the lease ran out mid-READ
	if po.pins("R") != 1 || po.p.Grants() != 1 {
		t.Fatalf("pin dropped under a READ being served: pins %d grants %d", po.pins("R"), po.p.Grants())
	}
	release()
	if po.pins("R") != 0 {
		t.Fatal("release did not unpin the ended grant")
	}
	po.poll(t, at(time.Hour+time.Millisecond))
	if po.p.Grants() != 0 {
		t.Fatal("ended grant not recycled")
	}
	// Close with a READ in flight, on a plane that serves through the
	// session's gate (on others, Close keeps every grant).
	po, _ = newPlaneProducer(t)
	po.poll(t, at(2*time.Hour), req("R", sid("a")))
	release, _ = po.p.authorizeRelease("cons", []byte(sid("a")+":R"), e.Blocks)
	po.p.Close()
	if po.pins("R") != 1 {
		t.Fatal("Close unpinned under a READ being served")
	}
	release()
	if po.pins("R") != 0 {
		t.Fatal("pin leaked after Close")
	}
}

func TestCovers(t *testing.T) {
	var scattered, run []int
	for i := range 100 {
		scattered = append(scattered, 3*i+1)
		run = append(run, 50+i)
	}
	rev := func(s []int) []int { r := slices.Clone(s); slices.Reverse(r); return r }
	for _, tc := range []struct {
		have, want []int
		ok         bool
	}{
		{scattered, scattered, true},
		{scattered, rev(scattered), true},
		{scattered, append(rev(scattered)[:60], 2), false},
		{scattered, append(rev(scattered)[:60], -1), false},
		{scattered, append(rev(scattered)[:60], 1000), false},
		{scattered, []int{4, 7}, true},
		{scattered, []int{4, 5}, false},
		{run, rev(run), true},
		{run, []int{49}, false},
		{run, []int{150}, false},
		{nil, nil, true},
		{nil, []int{0}, false},
	} {
		if got := covers(tc.have, tc.want); got != tc.ok {
			t.Errorf("covers(%d blocks, %v...) = %v", len(tc.have), tc.want[:min(3, len(tc.want))], got)
		}
	}
}

// Authorize and its release run on the data plane's goroutines while the
// step loop grants, completes and expires: under -race this checks the
// locking, and at the end every pin is back.
func TestAuthorizeConcurrentWithSteps(t *testing.T) {
	c := cache.NewEmbeddingCache(64)
	for i := range 8 {
		c.Alloc(fmt.Sprint("E", i), 2)
		c.MarkReady(fmt.Sprint("E", i))
	}
	data := xfake.New("prod", 64, 8)
	p := must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 5 * time.Millisecond, MaxPinnedShare: 1}, data, c, compat))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				h := fmt.Sprint("E", (i+w)%8)
				e, _ := c.Get(h)
				if rel, ok := p.authorizeRelease("cons", []byte(sid("a")+":"+h), e.Blocks); ok {
					for range i % 50 { // serving: the grant may end meanwhile
						runtime.Gosched()
					}
					rel()
				}
			}
		}()
	}
	out := &queue{}
	now := t0
	for i := range 2000 {
		now = now.Add(time.Millisecond)
		h := fmt.Sprint("E", i%8)
		p.Poll([]xfer.Message{{Identity: []byte("c"), Payload: req(h, sid("a"))}}, out, now)
		out.take()
		if i%3 == 0 {
			data.InjectNotif("cons", []byte(sid("a")+":"+h))
		}
	}
	close(stop)
	wg.Wait()
	p.Poll(nil, out, now.Add(time.Second))
	if p.Grants() != 0 || held(c) {
		t.Fatalf("grants %d, pinned entries %d", p.Grants(), c.Stats().Pinned)
	}
}

// held reports whether any entry of c is not ready or pinned.
func held(c *cache.EmbeddingCache) bool { st := c.Stats(); return st.NotReady > 0 || st.Pinned > 0 }
