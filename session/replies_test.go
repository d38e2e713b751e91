package session

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// newConsumerWith is newConsumer with timeouts of its own.
func newConsumerWith(t *testing.T, cfg xfer.Config) *consumerOnly {
	t.Helper()
	fab := xfake.NewFabric()
	co := &consumerOnly{data: fab.New("cons", 64, 16), prod: fab.New("prod", 64, 16), out: &queue{}}
	co.c = must(NewConsumerSession(ConsumerConfig{Logger: quiet, Xfer: cfg}, co.out, co.data, compat))
	return co
}

// lastAttempt returns the attempt the last request sent names.
func (co *consumerOnly) lastAttempt(t *testing.T) uint64 {
	t.Helper()
	var r wire.XferReq
	if err := wire.DecodeReq(co.out.msgs[len(co.out.msgs)-1], &r); err != nil {
		t.Fatal(err)
	}
	return r.Attempt
}

// fillProd writes pattern into the producer's blocks.
func (co *consumerOnly) fillProd(pattern byte, blocks ...int) {
	for _, b := range blocks {
		for i := range co.prod.Block(b) {
			co.prod.Block(b)[i] = pattern
		}
	}
}

// A reference producer names no attempt in its replies. Attempt 1 is
// granted at t0 (lease 5 s) but its OK ack is delayed; attempt 2 goes out
// at the ack timeout (3 s); at 5 s the lease of attempt 1 ends and a new
// save rewrites its blocks, and the producer answers attempt 2
// NACK_MISSING. At 5.5 s both replies arrive, the ack first. The ack
// answers attempt 1 (on one connection replies keep order): it is dropped,
// and the NACK ends attempt 2. No READ is posted, so no rewritten bytes
// are promoted.
func TestReferenceAckOfEarlierAttemptDropped(t *testing.T) {
	co := newConsumerWith(t, xfer.Config{PinLease: 5 * time.Second})
	co.fillProd(0xaa, 7, 8)
	mustStart(t, co.c, "H", []int{1, 2}, at(3*time.Second))
	if r := co.poll(at(3*time.Second + time.Millisecond)); len(r.retryable()) != 1 || r.retryable()[0].Reason != xfer.AckTimedOut {
		t.Fatalf("attempt 1: %+v", r)
	}
	if err := co.c.StartXfer("H", []int{1, 2}, at(6*time.Second), at(3*time.Second+time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	co.fillProd(0xbb, 7, 8) // a new save, after the lease of attempt 1
	late := ackOK("H", co.c.id, co.prod.AgentMetadata(), 7, 8)
	nack := encAck(wire.XferAck{MMHash: "H", Status: wire.NackMissing})
	r := co.poll(at(5500*time.Millisecond), late, nack)
	if len(co.data.Posts()) != 0 {
		t.Fatalf("READ posted for an earlier attempt's ack: %+v", co.data.Posts())
	}
	if len(r.Completed) != 0 || len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.Nacked || r.tombstoned()[0].Status != wire.NackMissing {
		t.Fatalf("results %+v", r)
	}
	if bytes.Equal(co.data.Block(1), co.prod.Block(7)) {
		t.Fatal("the new entry's bytes reached the consumer")
	}
}

// A Go producer's NACK of attempt 1, with a status this consumer does not
// know, arrives while attempt 2 waits for its ack: it names attempt 1, and
// cannot end attempt 2. Attempt 2's own ack then completes it.
func TestUndecodableNackOfEarlierAttemptDropped(t *testing.T) {
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	first := co.lastAttempt(t)
	co.poll(at(3 * time.Second)) // attempt 1 times out
	if err := co.c.StartXfer("H", []int{1}, at(5*time.Second), at(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	second := co.lastAttempt(t)
	stale, _ := msgpack.Marshal(map[string]any{"type": "ack", "mm_hash": "H", "status": 9, "ecx_attempt": first})
	if r := co.poll(at(4*time.Second), stale); r.Len() != 0 {
		t.Fatalf("attempt 1's NACK ended attempt 2: %+v", r)
	}
	ack := wire.XferAck{MMHash: "H", Status: wire.OK, SessionID: co.c.id, AgentMetadata: co.prod.AgentMetadata(),
		SrcBlockIndices: []wire.Int{wire.IntOf(3)}, Attempt: second}
	r := co.poll(at(4*time.Second+time.Millisecond), wire.AppendAck(nil, &ack))
	if !slices.Equal(hashes(r.Completed), []string{"H"}) {
		t.Fatalf("attempt 2's own ack: %+v", r)
	}
}

// An OK ack handled after the lease it advertises has run out (the engine
// stalled: the ack waited in the inbox past its deadline and the lease)
// posts no READ: the producer may have reused the blocks, and a posted
// READ cannot be stopped. The transfer may be retried: a new request is a
// new grant.
func TestAckPastItsLeasePostsNoRead(t *testing.T) {
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	ack := wire.XferAck{MMHash: "H", Status: wire.OK, SessionID: co.c.id, AgentMetadata: co.prod.AgentMetadata(),
		SrcBlockIndices: []wire.Int{wire.IntOf(3)}, LeaseMillis: 5000, Attempt: co.lastAttempt(t)}
	r := co.poll(at(5*time.Second+time.Millisecond), wire.AppendAck(nil, &ack))
	if len(co.data.Posts()) != 0 {
		t.Fatalf("READ posted past the lease: %+v", co.data.Posts())
	}
	if len(r.retryable()) != 1 || r.retryable()[0].Reason != xfer.LateCompletion || r.Len() != 1 {
		t.Fatalf("results %+v", r)
	}
}

// A producer that answers nothing fills the unanswered requests of an
// mm_hash up to their bound: then StartXfer refuses (errUnanswered, an
// xfer.ErrQueueFull, which the Pool retries) and sends nothing, rather
// than forget a request whose reply would be taken for a later one's. A
// reply frees a place.
func TestUnansweredRequestsBounded(t *testing.T) {
	co := newConsumer(t)
	now := t0
	for range maxUnansweredPerHash {
		mustStart(t, co.c, "H", []int{1}, now.Add(time.Second))
		now = now.Add(2 * time.Second)
		if r := co.poll(now); len(r.retryable()) != 1 {
			t.Fatalf("%+v", r)
		}
	}
	sent := len(co.out.msgs)
	err := co.c.StartXfer("H", []int{1}, now.Add(time.Second), now)
	if !errors.Is(err, errUnanswered) || !errors.Is(err, xfer.ErrQueueFull) || len(co.out.msgs) != sent || co.c.InFlight() > 0 {
		t.Fatalf("past the bound: %v, %d sent", err, len(co.out.msgs)-sent)
	}
	mustStart(t, co.c, "G", []int{1}, now.Add(time.Second)) // another mm_hash is not refused
	co.poll(now, encAck(wire.XferAck{MMHash: "H", Status: wire.NackMissing}))
	if co.c.Stats().StrayAcks != 1 {
		t.Fatal("the reply of the oldest request acted")
	}
	if err := co.c.StartXfer("H", []int{2}, now.Add(time.Second), now); err != nil {
		t.Fatalf("after a reply: %v", err)
	}
}

// A reply naming an attempt tells that the producer passed the requests
// of its mm_hash sent before it: they are forgotten, so a later reply
// naming no attempt (one that did not decode) is matched to its own
// request, not to a request the producer dropped.
func TestNamedReplyForgetsEarlierRequests(t *testing.T) {
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(time.Second))
	co.poll(at(2 * time.Second)) // attempt 1 times out: the producer dropped it
	mustStart(t, co.c, "H", []int{1}, at(3*time.Second))
	nack := wire.XferAck{MMHash: "H", Status: wire.NackNotReady, Attempt: co.lastAttempt(t)}
	if r := co.poll(at(2*time.Second), encAck(nack)); len(r.retryable()) != 1 {
		t.Fatalf("%+v", r)
	}
	if co.c.unanswered() != 0 || len(co.c.perHash) != 0 {
		t.Fatalf("%d requests still unanswered", co.c.unanswered())
	}
	mustStart(t, co.c, "H", []int{1}, at(5*time.Second))
	odd, _ := msgpack.Marshal(map[string]any{"type": "ack", "mm_hash": "H", "status": 9})
	if r := co.poll(at(4*time.Second), odd); len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.BadAck {
		t.Fatalf("%+v", r)
	}
}

// At PeerDown the connection is over: its unanswered requests are
// forgotten, and a reply the session still sees answers nothing.
func TestPeerDownForgetsUnansweredRequests(t *testing.T) {
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(time.Second))
	mustStart(t, co.c, "G", []int{2}, at(time.Second))
	co.c.PeerDown(at(0))
	if co.c.unanswered() != 0 || len(co.c.perHash) != 0 {
		t.Fatalf("%d requests still unanswered", co.c.unanswered())
	}
	co.poll(at(0), co.ok("H", 3))
	if st := co.c.Stats(); st.StrayAcks != 1 || len(co.data.Posts()) != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Attempt numbers never repeat across the sessions of a process, so a Go
// producer's reply naming one cannot be matched to another session's
// request.
func TestAttemptsUniqueAcrossSessions(t *testing.T) {
	a, b := newConsumer(t), newConsumer(t)
	seen := map[uint64]bool{}
	for i := range 4 {
		for _, co := range []*consumerOnly{a, b} {
			mustStart(t, co.c, fmt.Sprint("H", i), []int{1}, at(time.Second))
			n := co.lastAttempt(t)
			if n == 0 || seen[n] {
				t.Fatalf("attempt %d repeated or absent", n)
			}
			seen[n] = true
		}
	}
}

// A producer answers in the order of the requests, whatever their
// mm_hash: a reply tells that every request sent before the one it
// answers is answered or dropped. So a request the producer dropped
// costs its mm_hash one reply (taken for the dropped request's) until a
// reply of a request sent later comes, not every reply after it.
func TestReplyForgetsRequestsSentBefore(t *testing.T) {
	co := newConsumer(t)
	ok := func(h string, src int64) []byte { return co.ok(h, src) }
	mustStart(t, co.c, "G", []int{1}, at(time.Second)) // the producer drops it
	co.poll(at(2 * time.Second))
	mustStart(t, co.c, "G", []int{1}, at(4*time.Second))
	mustStart(t, co.c, "H", []int{2}, at(4*time.Second))
	// G's answer is taken for the dropped request's; H's, sent after both,
	// tells the producer has passed them.
	r := co.poll(at(3*time.Second), ok("G", 5), ok("H", 6))
	if !slices.Equal(hashes(r.Completed), []string{"H"}) || co.c.unanswered() != 0 {
		t.Fatalf("%+v, %d unanswered", r, co.c.unanswered())
	}
	if r := co.poll(at(5 * time.Second)); !slices.Equal(hashes(r.retryable()), []string{"G"}) {
		t.Fatalf("%+v", r)
	}
	mustStart(t, co.c, "G", []int{1}, at(7*time.Second))
	if r := co.poll(at(6*time.Second), ok("G", 5)); !slices.Equal(hashes(r.Completed), []string{"G"}) {
		t.Fatalf("G's next attempt: %+v", r)
	}
}

// A producer that names no grant (vLLM's) ends a grant by the READ's
// notification "<session_id>:<mm_hash>" alone, so a late notification of
// an earlier grant of a key would end the next grant of it under its READ
// (over NIXL nothing else holds the entry). The rule: once such a producer
// granted, no two requests of the session carry the same session id; a
// READ's notification names its own request's, and a reply echoing
// another request's id acts on nothing else.
func TestOwnSessionIDsForAProducerThatNamesNoGrant(t *testing.T) {
	co := newConsumer(t)
	meta := co.prod.AgentMetadata()
	req := func() wire.XferReq {
		t.Helper()
		var r wire.XferReq
		if err := wire.DecodeReq(co.out.msgs[len(co.out.msgs)-1], &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	mustStart(t, co.c, "H", []int{1, 2}, at(2*time.Second))
	first := req()
	if first.SessionID != co.c.id {
		t.Fatalf("before any grant: session id %q, want the session's %q", first.SessionID, co.c.id)
	}
	if r := co.poll(at(time.Millisecond), ackOK("H", first.SessionID, meta, 7, 8)); len(r.Completed) != 1 {
		t.Fatalf("first fetch: %+v", r)
	}
	if n := co.data.Posts()[0].Notif; n != first.SessionID+":H" {
		t.Fatalf("first READ's notification %q", n)
	}
	seen := map[string]bool{first.SessionID: true}
	var sids []string
	for i, h := range []string{"H", "G", "H"} {
		if err := co.c.StartXfer(h, []int{3 + i}, at(2*time.Second), at(3*time.Millisecond)); err != nil && i < 2 {
			t.Fatal(err)
		}
		if i == 2 {
			break // "H" is in flight: refused
		}
		r := req()
		if seen[r.SessionID] || r.SessionID == "" {
			t.Fatalf("request %d for %s carries session id %q again", i+2, h, r.SessionID)
		}
		seen[r.SessionID] = true
		sids = append(sids, r.SessionID)
	}
	// A late ack echoing the first request's id acts on nothing.
	if r := co.poll(at(4*time.Millisecond), ackOK("H", first.SessionID, meta, 9)); r.Len() != 0 || len(co.data.Posts()) != 1 {
		t.Fatalf("an ack of the first request acted: %+v, posts %d", r, len(co.data.Posts()))
	}
	if st := co.c.Stats(); st.StrayAcks != 1 {
		t.Fatalf("StrayAcks %d, want 1", st.StrayAcks)
	}
	// An ack echoing G's request's id does not answer H's.
	if r := co.poll(at(5*time.Millisecond), ackOK("H", sids[1], meta, 9)); r.Len() != 0 || len(co.data.Posts()) != 1 {
		t.Fatalf("an ack naming G's request acted on H: %+v", r)
	}
	co.poll(at(6*time.Millisecond), ackOK("H", sids[0], meta, 10))
	posts := co.data.Posts()
	if len(posts) != 2 || posts[1].Notif != sids[0]+":H" {
		t.Fatalf("second READ of H: %+v", posts)
	}
	// A NACK names no session: it answers the oldest request of its key.
	r := co.poll(at(7*time.Millisecond), encAck(wire.XferAck{MMHash: "G", Status: wire.NackMissing}))
	if len(r.tombstoned()) != 1 || r.tombstoned()[0].MMHash != "G" {
		t.Fatalf("G's NACK: %+v", r)
	}
}

func TestNackCountsString(t *testing.T) {
	var n NackCounts
	if n.String() != "none" {
		t.Fatalf("empty: %q", n.String())
	}
	n[wire.NackMissing], n[wire.NackNotReady] = 1002, 3
	if got, want := n.String(), "NACK_MISSING 1002, NACK_NOT_READY 3"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
