package session

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

type producerOnly struct {
	data  *xfake.Fake
	cache *cache.EmbeddingCache
	out   *queue
	p     *ProducerSession
}

// newProducer serves a cache of 16 blocks holding ready entry "R" (2 blocks)
// and not-ready entry "N" (1 block).
func newProducer(t *testing.T) *producerOnly {
	t.Helper()
	po := &producerOnly{data: xfake.New("prod", 16, 8), cache: cache.NewEmbeddingCache(16), out: &queue{}}
	if _, err := po.cache.Alloc("R", 2); err != nil {
		t.Fatal(err)
	}
	if err := po.cache.MarkReady("R"); err != nil {
		t.Fatal(err)
	}
	if _, err := po.cache.Alloc("N", 1); err != nil {
		t.Fatal(err)
	}
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, po.data, po.cache, compat))
	return po
}

func req(h, sid string) []byte {
	return wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: sid})
}

// poll sends one request per payload from identity "id<i>" and decodes the
// replies.
func (po *producerOnly) poll(t *testing.T, now time.Time, payloads ...[]byte) []wire.XferAck {
	t.Helper()
	var msgs []xfer.Message
	for i, p := range payloads {
		msgs = append(msgs, xfer.Message{Identity: []byte{'i', 'd', byte('0' + i)}, Payload: p})
	}
	po.p.Poll(msgs, po.out, now)
	var acks []wire.XferAck
	for _, raw := range po.out.msgs {
		var a wire.XferAck
		if err := wire.DecodeAck(raw, &a); err != nil {
			t.Fatalf("reply does not decode: %v", err)
		}
		acks = append(acks, a)
	}
	po.out.take()
	return acks
}

// poll2 is poll of messages as given (identities, arrival times).
func (po *producerOnly) poll2(t *testing.T, now time.Time, msgs ...xfer.Message) []wire.XferAck {
	t.Helper()
	po.p.Poll(msgs, po.out, now)
	var acks []wire.XferAck
	for _, raw := range po.out.take() {
		var a wire.XferAck
		if err := wire.DecodeAck(raw, &a); err != nil {
			t.Fatalf("reply does not decode: %v", err)
		}
		acks = append(acks, a)
	}
	return acks
}

func (po *producerOnly) pins(key string) int {
	e, _ := po.cache.Get(key)
	return e.Pins
}

func TestGrant(t *testing.T) { // a grant pins; OK acks carry ids and metadata, NACKs hash and status
	po := newProducer(t)
	acks := po.poll(t, t0, req("R", sid("s1")))
	if len(acks) != 1 {
		t.Fatalf("%d replies", len(acks))
	}
	a := acks[0]
	e, _ := po.cache.Get("R")
	var ids []int
	for _, v := range a.SrcBlockIndices {
		id, _ := v.Int()
		ids = append(ids, id)
	}
	if a.Status != wire.OK || a.SessionID != sid("s1") || !slices.Equal(ids, e.Blocks) ||
		!bytes.Equal(a.AgentMetadata, po.data.AgentMetadata()) || !bytes.Equal(a.MemDescriptor, po.data.MemDescriptor()) {
		t.Fatalf("ack %+v", a)
	}
	if e.Pins != 1 || po.p.Grants() != 1 || po.cache.Stats().Evictable != 0 {
		t.Fatalf("pins %d grants %d", e.Pins, po.p.Grants())
	}
}

func TestNackRules(t *testing.T) { // checks in order: version, compat hash, session id, then the cache
	v1, v3 := wire.IntOf(1), wire.IntOf(3)
	tests := []struct {
		name string
		req  wire.XferReq
		want wire.Status
	}{
		{"absent", wire.XferReq{MMHash: "X", CompatibilityHash: compat, SessionID: sid("s")}, wire.NackMissing},
		{"not ready", wire.XferReq{MMHash: "N", CompatibilityHash: compat, SessionID: sid("s")}, wire.NackNotReady},
		{"old version", wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: sid("s"), ConnectorVersion: &v1}, wire.NackVersion},
		{"version first", wire.XferReq{MMHash: "R", CompatibilityHash: "other", ConnectorVersion: &v3}, wire.NackVersion},
		{"compat", wire.XferReq{MMHash: "R", CompatibilityHash: "other", SessionID: sid("s")}, wire.NackIncompat},
		{"compat before session", wire.XferReq{MMHash: "R", CompatibilityHash: "other"}, wire.NackIncompat},
		{"empty session", wire.XferReq{MMHash: "R", CompatibilityHash: compat}, wire.NackInternal},
		{"empty session before lookup", wire.XferReq{MMHash: "X", CompatibilityHash: compat}, wire.NackInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			po := newProducer(t)
			acks := po.poll(t, t0, wire.AppendReq(nil, &tt.req))
			want := wire.XferAck{MMHash: tt.req.MMHash, Status: tt.want}
			if len(acks) != 1 || !sameAck(acks[0], want) {
				t.Fatalf("acks %+v, want only %+v", acks, want)
			}
			if po.p.Grants() != 0 || po.pins("R") != 0 || po.p.Stats().Nacks[tt.want] != 1 {
				t.Fatal("a NACK pinned or granted")
			}
		})
	}
}

func sameAck(a, b wire.XferAck) bool {
	return bytes.Equal(wire.AppendAck(nil, &a), wire.AppendAck(nil, &b))
}

func TestTwoSessionsAndReRequest(t *testing.T) { // two sessions, two grants; a re-request gets a grant of its own
	po := newProducer(t)
	po.poll(t, t0, req("R", sid("c1")), req("R", sid("c2")))
	if po.pins("R") != 2 || po.p.Grants() != 2 {
		t.Fatalf("pins %d grants %d", po.pins("R"), po.p.Grants())
	}
	// c1 asks again 20 s later: a second grant with its own pin and lease.
	// Unlike the reference, the first is kept: its READ may still run, and
	// its notification must end it, not the new one.
	po.poll(t, at(20*time.Second), req("R", sid("c1")))
	if po.pins("R") != 3 || po.p.Grants() != 3 || po.p.Stats().ReRequests != 1 {
		t.Fatalf("pins %d grants %d", po.pins("R"), po.p.Grants())
	}
	po.poll(t, at(31*time.Second)) // c1's first and c2's leases ran out, c1's second did not
	if po.pins("R") != 1 || po.p.Grants() != 1 || po.p.Stats().Expired != 2 {
		t.Fatalf("after 31 s: pins %d grants %d", po.pins("R"), po.p.Grants())
	}
	po.poll(t, at(51*time.Second))
	if po.pins("R") != 0 || po.p.Grants() != 0 {
		t.Fatal("renewed lease not swept")
	}
}

func TestNotifications(t *testing.T) { // a notification ends its grant once; unknown and malformed ones ignored
	po := newProducer(t)
	po.poll(t, t0, req("R", sid("c1")), req("R", sid("c2")))
	po.data.InjectNotif("cons", []byte(sid("c1")+":R"))
	po.data.InjectNotif("cons", []byte("ghost:unknown"))
	po.data.InjectNotif("cons", []byte{0xff, ':', 'R'})
	po.poll(t, at(time.Second))
	st := po.p.Stats()
	if po.pins("R") != 1 || st.Completions != 1 || st.UnknownNotifs != 1 || st.BadNotifs != 1 {
		t.Fatalf("pins %d stats %+v", po.pins("R"), st)
	}
	// A repeated notification finds no grant: no second unpin.
	po.data.InjectNotif("cons", []byte(sid("c1")+":R"))
	po.poll(t, at(2*time.Second))
	if po.pins("R") != 1 {
		t.Fatal("second unpin")
	}
	// The sweep does not unpin a completed grant again.
	po.poll(t, at(40*time.Second))
	if po.pins("R") != 0 || po.p.Stats().Expired != 1 {
		t.Fatalf("pins %d expired %d", po.pins("R"), po.p.Stats().Expired)
	}
}

func TestDrainErrorStillSweeps(t *testing.T) { // the lease sweep runs even when draining notifications fails
	po := newProducer(t)
	po.poll(t, t0, req("R", sid("c1")))
	po.data.SetDrainError(xfake.ErrInjected)
	po.poll(t, at(31*time.Second))
	if po.pins("R") != 0 || po.p.Stats().DrainErrors != 1 {
		t.Fatal("sweep skipped after a drain error")
	}
}

func TestMalformedAndOrder(t *testing.T) { // undecodable requests get no reply; one reply per request, in order
	po := newProducer(t)
	var msgs []xfer.Message
	for i, p := range [][]byte{req("R", sid("a")), {0x93, 1, 2, 3}, req("X", sid("b")), wire.AppendAck(nil, &wire.XferAck{MMHash: "R"}), req("N", sid("c"))} {
		msgs = append(msgs, xfer.Message{Identity: []byte{byte(i)}, Payload: p})
	}
	po.p.Poll(msgs, po.out, t0)
	if !slices.EqualFunc(po.out.ids, [][]byte{{0}, {2}, {4}}, bytes.Equal) {
		t.Fatalf("replies went to %v", po.out.ids)
	}
	if po.p.Stats().Malformed != 2 || po.p.Stats().Requests != 3 {
		t.Fatalf("stats %+v", po.p.Stats())
	}
}

func TestReplyErrorReleasesPin(t *testing.T) {
	po := newProducer(t)
	po.out.err = errSend
	po.poll(t, t0, req("R", sid("c1")))
	if po.pins("R") != 0 || po.p.Grants() != 0 || po.p.Stats().ReplyErrors != 1 {
		t.Fatalf("pins %d grants %d", po.pins("R"), po.p.Grants())
	}
}

// Close on a data plane that serves READs only through the session's gate
// ends every grant at once; a closed session grants nothing.
func TestProducerClose(t *testing.T) {
	po, _ := newPlaneProducer(t)
	po.poll(t, t0, req("R", sid("c1")), req("R", sid("c2")))
	if err := po.p.Close(); err != nil || po.p.Grants() != 0 || po.pins("R") != 0 {
		t.Fatalf("close: %v, %d grants, pins %d", err, po.p.Grants(), po.pins("R"))
	}
	if err := po.p.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	po.out.msgs = nil
	po.poll(t, t0, req("R", sid("c3")))
	if po.pins("R") != 0 || len(po.out.msgs) != 0 {
		t.Fatal("closed session granted")
	}
}

// sid returns a canonical UUID named after name.
func sid(name string) string {
	var h uint64
	for _, c := range name {
		h = h*31 + uint64(c)
	}
	return fmt.Sprintf("00000000-0000-4000-8000-%012x", h&0xffffffffffff)
}
