package session

import (
	"errors"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// contactPair is a consumer session and a producer session over a fabric,
// their messages carried by hand.
type contactPair struct {
	toP, toC *queue
	c        *ConsumerSession
	p        *ProducerSession
	pdata    *xfake.Fake
	pc       *cache.EmbeddingCache
}

func newContactPair(t *testing.T) *contactPair {
	t.Helper()
	fab := xfake.NewFabric()
	cp := &contactPair{toP: &queue{}, toC: &queue{}, pdata: fab.New("prod", 16, 8), pc: cache.NewEmbeddingCache(16)}
	cp.pc.Alloc("R", 2)
	cp.pc.MarkReady("R")
	cp.c = must(NewConsumerSession(ConsumerConfig{Logger: quiet}, cp.toP, fab.New("cons", 16, 8), compat))
	cp.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, cp.pdata, cp.pc, compat))
	return cp
}

// exchange carries the consumer's requests to the producer, through strip
// if set (a producer that reads none of the extensions), and the answers
// back, at now.
func (cp *contactPair) exchange(now time.Time, strip bool) {
	var msgs []xfer.Message
	for _, raw := range cp.toP.take() {
		if strip {
			var r wire.XferReq
			wire.DecodeReq(raw, &r)
			raw = wire.AppendReq(nil, &wire.XferReq{MMHash: r.MMHash, CompatibilityHash: r.CompatibilityHash, SessionID: r.SessionID})
		}
		msgs = append(msgs, xfer.Message{Identity: []byte("c"), Payload: raw})
	}
	cp.p.Poll(msgs, cp.toC, now)
	var acks [][]byte
	for _, raw := range cp.toC.take() {
		if strip { // its answers name no attempt either
			var a wire.XferAck
			wire.DecodeAck(raw, &a)
			a.Attempt, a.Grant, a.Token, a.LeaseMillis = 0, 0, wire.Token{}, 0
			raw = wire.AppendAck(nil, &a)
		}
		acks = append(acks, raw)
	}
	cp.c.Poll(acks, now)
}

// A contact request registers a Go producer before any fetch: its answer
// carries the producer's metadata and region, no grant and no pin. The
// requests after it say the consumer has the producer registered
// (ecx_known), and their acks carry no description of the region.
func TestContactRegistersTheProducer(t *testing.T) {
	cp := newContactPair(t)
	if done, _, _ := cp.c.contacted(); done {
		t.Fatal("done before any contact")
	}
	if err := cp.c.sendContact(at(time.Second), t0); err != nil {
		t.Fatal(err)
	}
	if !cp.c.probing() {
		t.Fatal("not probing while the contact waits")
	}
	cp.exchange(at(time.Millisecond), false)
	done, st, err := cp.c.contacted()
	if !done || st != wire.OK || err != nil {
		t.Fatalf("contacted: %v %s %v", done, st, err)
	}
	if peer, ok := cp.c.registeredPeer(); !ok || peer.Blocks != 16 || cp.c.probing() {
		t.Fatalf("registered %v %+v, probing %v", ok, peer, cp.c.probing())
	}
	ps := cp.p.Stats()
	if ps.Contacts != 1 || ps.Grants != 0 || ps.DescsSent+ps.ShapesSent != 1 || cp.p.Grants() != 0 {
		t.Fatalf("producer %+v, %d grants", ps, cp.p.Grants())
	}
	if e, _ := cp.pc.Get("R"); e.Pins != 0 {
		t.Fatal("a contact pinned an entry")
	}
	mustStart(t, cp.c, "R", []int{3, 4}, at(time.Second))
	var r wireview.Req
	if err := wireview.DecodeReq(cp.toP.msgs[0], &r); err != nil || r.Known != wirext.MetaDigest(cp.pdata.AgentMetadata()) || r.Contact {
		t.Fatalf("request after the contact: %v %+v", err, r)
	}
	cp.exchange(at(2*time.Millisecond), false)
	if ps := cp.p.Stats(); ps.Grants != 1 || ps.DescsSent+ps.ShapesSent != 1 {
		t.Fatalf("the ack described the region again: %+v", ps)
	}
	if cp.c.Stats().Registrations != 1 {
		t.Fatalf("registered %d times", cp.c.Stats().Registrations)
	}
	res := cp.poll(at(3 * time.Millisecond))
	if len(res.Completed) != 1 {
		t.Fatalf("%+v", res)
	}
}

func (cp *contactPair) poll(now time.Time) Results {
	cp.c.Poll(nil, now)
	var r Results
	cp.c.TakeResults(&r)
	return r
}

// A producer that does not read the contact request (vLLM's, which
// answers NACK_MISSING, and names no attempt) leaves the session
// unregistered, and the first fetch registers it as before. No answer by
// the deadline, or a dead connection, end the contact with an error.
func TestContactWithoutTheExtension(t *testing.T) {
	cp := newContactPair(t)
	cp.c.sendContact(at(time.Second), t0)
	cp.exchange(at(time.Millisecond), true)
	if done, st, err := cp.c.contacted(); !done || st != wire.NackMissing || err != nil {
		t.Fatalf("contacted: %v %s %v", done, st, err)
	}
	if _, ok := cp.c.registeredPeer(); ok || cp.c.Stats().StrayAcks != 0 {
		t.Fatalf("registered %v, stray %d", ok, cp.c.Stats().StrayAcks)
	}
	mustStart(t, cp.c, "R", []int{3, 4}, at(time.Second))
	cp.exchange(at(2*time.Millisecond), true)
	if _, ok := cp.c.registeredPeer(); !ok {
		t.Fatal("the first ack did not register the producer")
	}

	cp = newContactPair(t)
	cp.c.sendContact(at(time.Second), t0)
	cp.toP.take()
	cp.poll(at(time.Second))
	if done, _, _ := cp.c.contacted(); done {
		t.Fatal("done at its deadline")
	}
	cp.poll(at(time.Second + time.Nanosecond))
	if done, _, err := cp.c.contacted(); !done || !errors.Is(err, errNoContactAnswer) {
		t.Fatalf("past its deadline: %v %v", done, err)
	}
	cp.c.sendContact(at(3*time.Second), at(2*time.Second))
	cp.c.PeerDown(at(2 * time.Second))
	if done, _, err := cp.c.contacted(); !done || !errors.Is(err, errContactLost) {
		t.Fatalf("after PeerDown: %v %v", done, err)
	}
}

// touchingFake is a data plane with a touch page (plane.Toucher).
type touchingFake struct {
	*xfake.Fake
	page wire.Blocks
}

func (f touchingFake) TouchPage() wire.Blocks { return f.page }

// A producer whose data plane has a touch page names it in its contact
// answers, and there only: the consumer gives it to its data plane's
// contact, and no ack of a fetch carries it. A plane without one names
// none.
func TestContactAnswerNamesTheTouchPage(t *testing.T) {
	page := wire.Blocks{Base: 1 << 30, Size: 64, Count: 1}
	for _, touching := range []bool{false, true} {
		cp := newContactPair(t)
		var data xfer.DataTransport = cp.pdata
		if touching {
			data = touchingFake{cp.pdata, page}
		}
		cp.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, data, cp.pc, compat))
		want := wire.Blocks{}
		if touching {
			want = page
		}
		if err := cp.c.sendContact(at(time.Second), t0); err != nil {
			t.Fatal(err)
		}
		cp.exchange(at(time.Millisecond), false)
		if done, st, err := cp.c.contacted(); !done || st != wire.OK || err != nil {
			t.Fatalf("contacted: %v %s %v", done, st, err)
		}
		if got := cp.c.contactOf().Touch; got != want {
			t.Fatalf("touching %v: the contact has touch page %+v, want %+v", touching, got, want)
		}
		mustStart(t, cp.c, "R", []int{3, 4}, at(time.Second))
		cp.p.Poll([]xfer.Message{{Identity: []byte("c"), Payload: cp.toP.take()[0]}}, cp.toC, at(2*time.Millisecond))
		var a wire.XferAck
		if acks := cp.toC.take(); len(acks) != 1 || wire.DecodeAck(acks[0], &a) != nil || a.Status != wire.OK || a.Touch != (wire.Blocks{}) {
			t.Fatalf("touching %v: the fetch's ack %+v", touching, a)
		}
	}
}

// What a contact answer gave the data plane's contact belongs to the
// registration it made: once an ack of a new incarnation of the producer
// (new metadata) registers it again, the old touch page and contact
// notification are no longer given to a contact with the new agent.
func TestContactAnswerBelongsToItsRegistration(t *testing.T) {
	cp := newContactPair(t)
	fab := xfake.NewFabric()
	old := wire.Blocks{Base: 1 << 30, Size: 64, Count: 1}
	cp.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, touchingFake{fab.New("prod", 16, 8), old}, cp.pc, compat))
	if err := cp.c.sendContact(at(time.Second), t0); err != nil {
		t.Fatal(err)
	}
	cp.exchange(at(time.Millisecond), false)
	if got := cp.c.contactOf().Touch; got != old {
		t.Fatalf("the contact has touch page %+v, want %+v", got, old)
	}
	first, _ := cp.c.registeredPeer()
	// The producer restarts: a new agent, a new touch page.
	newer := wire.Blocks{Base: 1 << 31, Size: 64, Count: 1}
	cp.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, touchingFake{fab.New("prod2", 16, 8), newer}, cp.pc, compat))
	mustStart(t, cp.c, "R", []int{3, 4}, at(time.Second))
	cp.exchange(at(2*time.Millisecond), false)
	if peer, ok := cp.c.registeredPeer(); !ok || peer.Agent == first.Agent {
		t.Fatalf("not registered again: %v %+v", ok, peer)
	}
	if k := cp.c.contactOf(); k.Touch != (wire.Blocks{}) || k.Notif != nil {
		t.Fatalf("after the restart the contact would get %+v", k)
	}
}
