package session

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

func from(ident string, raw []byte) xfer.Message {
	return xfer.Message{Identity: []byte(ident), Payload: raw}
}

// One control-plane identity asks for contact grants (no entry, no pin)
// under session ids it makes up. Each session holds one contact grant at
// most (its second request replaces the first), the identity at most its
// share (MaxGrantsPerIdentity: here MaxGrantsPerSession, 2), and the
// contacts past it are answered without a grant; a neighbour's first
// request is granted.
func TestMadeUpSessionsCannotTakeEveryGrant(t *testing.T) {
	po, f := newPlaneProducer(t)
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 10 * time.Second,
		MaxGrantsPerSession: 2, MaxGrants: 6}, f, po.cache, compat))
	f.take()
	var msgs []xfer.Message
	for s := range 3 {
		for range 2 {
			msgs = append(msgs, from("hostile", contactReq("c", sid(fmt.Sprint("made-up", s)), 1)))
		}
	}
	acks := po.poll2(t, t0, msgs...)
	var grants []uint64
	for i, a := range acks {
		if a.Status != wire.OK {
			t.Fatalf("contact %d: %s", i, a.Status)
		}
		grants = append(grants, a.Grant)
	}
	if grants[0] == 0 || grants[1] == 0 || grants[2] == 0 || grants[3] == 0 || grants[4] != 0 || grants[5] != 0 {
		t.Fatalf("contact grants %v: want one per session for the first two sessions, none for the third", grants)
	}
	retired := f.take()
	for _, g := range []uint64{grants[0], grants[2]} {
		if po.p.byID[g] != nil || !slices.Contains(retired, fmt.Sprintf("retire %d pins 0", g)) {
			t.Fatalf("the replaced contact grant %d is still live (%q)", g, retired)
		}
	}
	if po.p.Grants() != 2 {
		t.Fatalf("the identity holds %d grants, want its share, 2", po.p.Grants())
	}
	ack := po.poll2(t, at(time.Millisecond), from("neighbour", req("R", sid("neighbour"))))[0]
	if ack.Status != wire.OK {
		t.Fatalf("the neighbour's first request: %s", ack.Status)
	}
	po.p.Poll(nil, po.out, at(11*time.Second)) // the leases
	if po.p.Grants() != 0 || len(po.p.askers) != 0 {
		t.Fatalf("after the leases: %d grants, identities %d", po.p.Grants(), len(po.p.askers))
	}
}

// One identity floods ordinary requests under made-up session ids: it is
// granted its share and then answered NACK_NOT_READY (retry later), never
// NACK_INTERNAL; a neighbour within its share is served all along. When
// identities each within their share fill the table, a newcomer is
// answered NACK_NOT_READY, and served once a grant ends.
func TestNeighbourServedWhileAnotherFloods(t *testing.T) {
	po := newProducer(t)
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 10 * time.Second,
		MaxGrantsPerSession: 2, MaxGrantsPerIdentity: 3, MaxGrants: 8}, po.data, po.cache, compat))
	var msgs []xfer.Message
	for s := range 10 {
		msgs = append(msgs, from("flood", req("R", sid(fmt.Sprint("flood", s)))))
		if s%3 == 2 {
			msgs = append(msgs, from("neighbour", req("R", sid(fmt.Sprint("neighbour", s)))))
		}
	}
	var flood, neighbour []wire.Status
	for i, a := range po.poll2(t, t0, msgs...) {
		if string(msgs[i].Identity) == "flood" {
			flood = append(flood, a.Status)
		} else {
			neighbour = append(neighbour, a.Status)
		}
	}
	if want := []wire.Status{wire.OK, wire.OK, wire.OK, wire.NackNotReady}; !slices.Equal(flood[:4], want) ||
		slices.ContainsFunc(flood[3:], func(s wire.Status) bool { return s != wire.NackNotReady }) {
		t.Fatalf("the flood: %v", flood)
	}
	if !slices.Equal(neighbour, []wire.Status{wire.OK, wire.OK, wire.OK}) {
		t.Fatalf("the neighbour within its share: %v", neighbour)
	}
	// Two more identities within their share fill the table (8).
	acks := po.poll2(t, at(time.Second), from("x", req("R", sid("x"))), from("y", req("R", sid("y"))),
		from("late", req("R", sid("late"))))
	if acks[0].Status != wire.OK || acks[1].Status != wire.OK || acks[2].Status != wire.NackNotReady || po.p.Grants() != 8 {
		t.Fatalf("a full table of grants within their shares: %s %s %s, grants %d",
			acks[0].Status, acks[1].Status, acks[2].Status, po.p.Grants())
	}
	if a := po.poll2(t, at(10500*time.Millisecond), from("late", req("R", sid("late"))))[0]; a.Status != wire.OK {
		t.Fatalf("the newcomer once grants ended: %s", a.Status)
	}
}

// A consumer session holds one contact grant: each new contact request of
// the identity that asked for it replaces it, and another identity naming
// the session gets no second one. An identity holds maxContactsPerIdent
// contact grants at most, whatever its share of grants.
func TestContactGrantsBounded(t *testing.T) {
	po, _ := newPlaneProducer(t)
	a := sid("a")
	var last uint64
	for i := range 5 {
		g := po.poll2(t, at(time.Duration(i)*time.Millisecond), from("c", contactReq("c", a, uint64(i+1))))[0].Grant
		if g == 0 || po.p.Grants() != 1 || last != 0 && po.p.byID[last] != nil {
			t.Fatalf("contact %d: grant %d, %d grants live", i, g, po.p.Grants())
		}
		last = g
	}
	if g := po.poll2(t, at(time.Second), from("other", contactReq("c", a, 1)))[0].Grant; g != 0 || po.p.byID[last] == nil {
		t.Fatalf("another identity naming the session: grant %d; the session's own kept: %v", g, po.p.byID[last] != nil)
	}
	var made int
	for s := range maxContactsPerIdent + 2 {
		if po.poll2(t, at(2*time.Second), from("many", contactReq("c", sid(fmt.Sprint("s", s)), 1)))[0].Grant != 0 {
			made++
		}
	}
	if made != maxContactsPerIdent || po.p.askers["many"].contacts != maxContactsPerIdent {
		t.Fatalf("%d contact grants for one identity, want %d", made, maxContactsPerIdent)
	}
}
