package session

import (
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// contactReq is a Go consumer's contact request for mm_hash h.
func contactReq(h, sid string, attempt uint64) []byte {
	return wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: sid,
		Attempt: attempt, Agent: "cons", Contact: true})
}

// A contact is known by the request's flag alone. An entry that has the
// contact request's mm_hash is an ordinary entry: a plain request for it,
// vLLM's or a Go consumer's, gets its blocks, charged to the session's
// share, whether the same session's contact grant came before or after;
// ending the grants gives every share back. A contact request pins
// nothing and charges no share, whichever mm_hash it names.
func TestContactKeyIsAnOrdinaryEntry(t *testing.T) {
	for _, contactFirst := range []bool{false, true} {
		name := "entry first"
		if contactFirst {
			name = "contact first"
		}
		t.Run(name, func(t *testing.T) {
			po, f := newPlaneProducer(t)
			key := wirext.ContactHash
			if _, err := po.cache.Alloc(key, 3); err != nil {
				t.Fatal(err)
			}
			po.cache.MarkReady(key)
			e, _ := po.cache.Get(key)
			a := sid("a")
			one := func(now time.Time, raw []byte) wire.XferAck {
				t.Helper()
				return po.poll2(t, now, xfer.Message{Identity: []byte("c"), Payload: raw})[0]
			}
			contact := func(now time.Time) wire.XferAck {
				t.Helper()
				ack := one(now, contactReq(key, a, 7))
				if ack.Status != wire.OK || ack.Grant == 0 || len(ack.SrcBlockIndices) != 0 {
					t.Fatalf("contact answer %+v", ack)
				}
				return ack
			}
			plain := func(now time.Time) {
				t.Helper()
				ack := one(now, req(key, a))
				var got []int
				for _, b := range ack.SrcBlockIndices {
					v, _ := b.Int()
					got = append(got, v)
				}
				if ack.Status != wire.OK || !slices.Equal(got, e.Blocks) || ack.Grant == 0 {
					t.Fatalf("plain request for %q: %s blocks %v, the entry's %v", key, ack.Status, got, e.Blocks)
				}
			}
			var k wire.XferAck
			if contactFirst {
				k = contact(t0)
				if po.pins(key) != 0 || po.p.consumers[a].blocks != 0 || len(po.p.idents) != 0 {
					t.Fatalf("a contact pinned %d, charged session %d, identities %v",
						po.pins(key), po.p.consumers[a].blocks, po.p.idents)
				}
				plain(at(time.Millisecond))
			} else {
				plain(t0)
				k = contact(at(time.Millisecond))
			}
			if po.pins(key) != 1 || po.p.consumers[a].blocks != 3 || po.p.idents["c"] != 3 || po.p.Stats().ReRequests != 0 {
				t.Fatalf("entry and contact: %d pins, session charged %d, identity %d, stats %+v",
					po.pins(key), po.p.consumers[a].blocks, po.p.idents["c"], po.p.Stats())
			}
			// vLLM's notification, the bare key, ends the entry's grant.
			f.InjectNotif("cons", []byte(a+":"+key))
			po.poll(t, at(2*time.Millisecond))
			if po.pins(key) != 0 || po.p.Grants() != 1 || po.p.consumers[a].blocks != 0 || len(po.p.idents) != 0 {
				t.Fatalf("after the entry's notification: %d pins, %d grants, session charged %d, identities %v",
					po.pins(key), po.p.Grants(), po.p.consumers[a].blocks, po.p.idents)
			}
			f.InjectNotif("cons", wirext.AppendNotifGrant([]byte(a+":"+key), k.Grant, k.Token))
			po.poll(t, at(3*time.Millisecond))
			if po.p.Grants() != 0 || po.p.Stats().Completions != 2 || po.p.consumers[a].blocks != 0 || len(po.p.idents) != 0 {
				t.Fatalf("after the contact's notification: %d grants, session charged %d, stats %+v",
					po.p.Grants(), po.p.consumers[a].blocks, po.p.Stats())
			}
		})
	}
}

// A request with the contact flag is never looked up in the cache: one
// naming a ready entry pins it not; one naming an entry the cache lacks
// is answered as a contact, not NACK_MISSING. Without the flag the
// contact's mm_hash is an ordinary one: NACK_MISSING while no entry has
// it.
func TestContactFlagAloneMakesAContact(t *testing.T) {
	po, f := newPlaneProducer(t)
	b := sid("b")
	acks := po.poll2(t, t0,
		xfer.Message{Identity: []byte("c"), Payload: contactReq("R", b, 1)},
		xfer.Message{Identity: []byte("c"), Payload: contactReq("nowhere", b, 2)},
		xfer.Message{Identity: []byte("c"), Payload: req(wirext.ContactHash, b)},
		xfer.Message{Identity: []byte("c"), Payload: goReq(wirext.ContactHash, b, 3)})
	for i, a := range acks[:2] {
		if a.Status != wire.OK || a.Grant == 0 || len(a.SrcBlockIndices) != 0 || len(a.AgentMetadata) == 0 {
			t.Fatalf("contact %d: %+v", i, a)
		}
	}
	if acks[2].Status != wire.NackMissing || acks[3].Status != wire.NackMissing {
		t.Fatalf("plain requests for %q: %s, %s", wirext.ContactHash, acks[2].Status, acks[3].Status)
	}
	pins := map[string]int{}
	po.p.pinCounts(pins)
	if po.pins("R") != 0 || len(pins) != 0 || po.p.consumers[b].blocks != 0 || len(po.p.idents) != 0 || po.p.Stats().Contacts != 2 {
		t.Fatalf("contacts pinned R %d, session pins %v, charged %d, identities %v, stats %+v",
			po.pins("R"), pins, po.p.consumers[b].blocks, po.p.idents, po.p.Stats())
	}
	// Their leases end them, giving back nothing they did not take.
	po.poll(t, at(time.Minute))
	if po.p.Grants() != 0 || po.pins("R") != 0 || po.p.consumers[b].blocks != 0 || len(po.p.idents) != 0 {
		t.Fatalf("after the leases: %d grants, R pinned %d, charged %d", po.p.Grants(), po.pins("R"), po.p.consumers[b].blocks)
	}
	f.take()
}

// A grant of an entry of no blocks pins it like any other, and its end
// unpins it: only the contact flag makes a grant that pins nothing.
func TestEntryOfNoBlocksIsUnpinned(t *testing.T) {
	po, f := newPlaneProducer(t)
	if _, err := po.cache.Alloc("Z", 0); err != nil {
		t.Fatal(err)
	}
	po.cache.MarkReady("Z")
	a := sid("a")
	if ack := po.poll(t, t0, req("Z", a))[0]; ack.Status != wire.OK || len(ack.SrcBlockIndices) != 0 || po.pins("Z") != 1 {
		t.Fatalf("ack %s, %d pins", ack.Status, po.pins("Z"))
	}
	f.InjectNotif("cons", []byte(a+":Z"))
	po.poll(t, at(time.Millisecond))
	if po.pins("Z") != 0 || po.p.Grants() != 0 {
		t.Fatalf("after its notification: %d pins, %d grants", po.pins("Z"), po.p.Grants())
	}
	f.take()
}
