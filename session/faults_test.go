package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A session fetches R, its READ completes but the notification is
// late; it fetches R again. The late notification must end the first grant,
// never the second, whichever notification form the consumer uses.
func TestRefetchLateNotificationEndsTheOldGrant(t *testing.T) {
	for _, withID := range []bool{false, true} {
		t.Run(fmt.Sprintf("grant-id=%v", withID), func(t *testing.T) {
			po := newProducer(t)
			a := sid("a")
			first := po.poll(t, t0, req("R", a))[0]
			second := po.poll(t, at(time.Second), req("R", a))[0]
			if first.Status != wire.OK || second.Status != wire.OK || first.Grant == second.Grant {
				t.Fatalf("acks %+v %+v", first, second)
			}
			notif := func(g uint64) []byte {
				if withID {
					return fmt.Appendf(nil, "%s:R#%d", a, g)
				}
				return []byte(a + ":R")
			}
			e, _ := po.cache.Get("R")
			// The second READ is being served when the first's notification lands.
			release, ok := po.p.authorizeRelease("cons", notif(second.Grant), e.Blocks)
			if !ok {
				t.Fatal("second READ refused")
			}
			po.data.InjectNotif("cons", notif(first.Grant))
			po.poll(t, at(2*time.Second))
			// Without grant ids the served READ may have held the oldest
			// grant, which the notification then ended: its pin stays
			// until the READ is released. Either way one grant is live.
			if po.pins("R") < 1 || len(po.p.byID) != 1 || po.p.Stats().Completions != 1 {
				t.Fatalf("after the first notification: pins %d", po.pins("R"))
			}
			release()
			if po.pins("R") != 1 {
				t.Fatalf("after the READ's release: pins %d", po.pins("R"))
			}
			release, ok = po.p.authorizeRelease("cons", notif(second.Grant), e.Blocks)
			if !ok {
				t.Fatal("the second grant was ended by the first READ's notification")
			}
			release()
			po.data.InjectNotif("cons", notif(second.Grant))
			po.poll(t, at(3*time.Second))
			if po.pins("R") != 0 || po.p.Grants() != 0 {
				t.Fatalf("pins %d grants %d", po.pins("R"), po.p.Grants())
			}
		})
	}
}

// One consumer session cannot pin more than its share of the cache when
// saves are short of room; while they are not, a pin over the share is
// granted. The live grants of one entry per session are bounded.
func TestPinnedShare(t *testing.T) {
	c := cache.NewEmbeddingCache(20)
	for i := range 4 {
		c.Alloc(fmt.Sprint("E", i), 4)
		c.MarkReady(fmt.Sprint("E", i))
	}
	po := &producerOnly{data: xfake.New("prod", 20, 8), cache: c, out: &queue{}}
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, po.data, c, compat))
	// "a" pins 12 blocks, over its share of 10: no save is short of room.
	acks := po.poll(t, t0, req("E0", sid("a")), req("E1", sid("a")), req("E2", sid("a")))
	for i, a := range acks {
		if a.Status != wire.OK {
			t.Fatalf("ack %d: %s while no save is short of room", i, a.Status)
		}
	}
	// A save under way takes the free blocks: a pin over the share would
	// now leave no room for the next. Refused, retryable, its pin
	// dropped; another session within its share is granted.
	if _, err := c.Alloc("saving", 4); err != nil {
		t.Fatalf("save failed: %v", err)
	}
	acks = po.poll(t, at(time.Millisecond), req("E3", sid("a")), req("E3", sid("b")))
	if acks[0].Status != wire.NackNotReady || acks[1].Status != wire.OK {
		t.Fatalf("under pressure: %s for the session over its share, %s for the other", acks[0].Status, acks[1].Status)
	}
	if e, _ := c.Get("E3"); e.Pins != 1 || po.p.Stats().OverPinned != 1 {
		t.Fatalf("refused grant left a pin (%d pins) or was not counted (%d)", e.Pins, po.p.Stats().OverPinned)
	}
	// One identity under many session ids is bounded too: its pin of X,
	// over its share, would leave no room for a save as large as the
	// largest yet. The save then finds room; another identity within its
	// share is granted.
	po2 := &producerOnly{data: xfake.New("prod", 8, 8), cache: cache.NewEmbeddingCache(8), out: &queue{}}
	for _, h := range []string{"R", "X"} {
		po2.cache.Alloc(h, 4)
		po2.cache.MarkReady(h)
	}
	po2.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, po2.data, po2.cache, compat))
	po2.p.Poll([]xfer.Message{
		{Identity: []byte("one"), Payload: req("R", sid("s0"))},
		{Identity: []byte("one"), Payload: req("X", sid("s1"))},
	}, po2.out, t0)
	if po2.pins("R") != 1 || po2.pins("X") != 0 || po2.p.Stats().OverPinned != 1 {
		t.Fatalf("pins R %d X %d, refused %d: the identity took the room of the next save",
			po2.pins("R"), po2.pins("X"), po2.p.Stats().OverPinned)
	}
	if _, err := po2.cache.Alloc("S", 4); err != nil {
		t.Fatalf("save after the identity was refused: %v", err)
	}
	po2.p.Poll([]xfer.Message{{Identity: []byte("two"), Payload: req("R", sid("s3"))}}, po2.out, at(time.Millisecond))
	if po2.pins("R") != 2 || po2.p.Stats().OverPinned != 1 {
		t.Fatalf("pins R %d, refused %d: the other identity was refused", po2.pins("R"), po2.p.Stats().OverPinned)
	}
	// A second grant of an entry the session holds pins no new block: it
	// is not refused by the share.
	if acks := po.poll(t, at(time.Millisecond), req("E0", sid("a"))); acks[0].Status != wire.OK {
		t.Fatalf("re-request of a held entry: %s", acks[0].Status)
	}
	// Re-requests of one entry: MaxGrantsPerEntry (8) live grants at most;
	// beyond, NACK_NOT_READY, which consumers retry.
	po3 := newProducer(t)
	po3.p = must(NewProducerSession(ProducerConfig{Logger: quiet, MaxPinnedShare: 1}, po3.data, po3.cache, compat))
	var reqs [][]byte
	for range 10 {
		reqs = append(reqs, req("R", sid("a")))
	}
	for i := range reqs { // one identity per poll call: keep within the share
		want := wire.OK
		if i >= 8 {
			want = wire.NackNotReady
		}
		if acks := po3.poll(t, at(time.Duration(i)*time.Millisecond), reqs[i]); acks[0].Status != want {
			t.Fatalf("re-request %d: %s, want %s", i, acks[0].Status, want)
		}
	}
	if po3.pins("R") != 8 || po3.p.Stats().OverBound != 2 {
		t.Fatalf("re-requests pinned %d times", po3.pins("R"))
	}
}

// A request that waited past MaxRequestAge is not granted but answered
// NACK_NOT_READY (its attempt echoed), so that a consumer still waiting
// retries instead of waiting out its ack timeout.
func TestStaleRequestAnsweredNotReady(t *testing.T) {
	po := newProducer(t)
	old := wire.AppendReq(nil, &wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: sid("a"), Attempt: 41})
	acks := po.poll2(t, at(2500*time.Millisecond),
		xfer.Message{Identity: []byte("a"), Payload: old, At: t0},
		xfer.Message{Identity: []byte("b"), Payload: req("R", sid("b")), At: at(2 * time.Second)})
	if len(acks) != 2 || po.pins("R") != 1 || po.p.Stats().Stale != 1 {
		t.Fatalf("replies %d pins %d stale %d", len(acks), po.pins("R"), po.p.Stats().Stale)
	}
	if a := acks[0]; a.Status != wire.NackNotReady || a.MMHash != "R" || a.Attempt != 41 || a.Grant != 0 {
		t.Fatalf("stale request answered %+v", a)
	}
	if acks[1].Status != wire.OK {
		t.Fatalf("fresh request answered %s", acks[1].Status)
	}
}

// A Go consumer puts connector_version and its agent
// name on the wire; it honours the lease the producer advertises, and
// names the grant in its notification.
func TestConsumerSpeaksTheExtensions(t *testing.T) {
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	var r wireview.Req
	if err := wireview.DecodeReq(co.out.msgs[0], &r); err != nil {
		t.Fatal(err)
	}
	if !r.HasVersion || string(r.Agent) != "cons" {
		t.Fatalf("request %+v", r)
	}
	// A producer of another version NACKs it instead of granting.
	po := newProducer(t)
	po.p.Poll([]xfer.Message{{Identity: []byte("x"), Payload: withVersion(co.out.msgs[0], 3)}}, po.out, t0)
	var a wire.XferAck
	wire.DecodeAck(po.out.msgs[0], &a)
	if a.Status != wire.NackVersion {
		t.Fatalf("producer of version 3 answered %s", a.Status)
	}

	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	ack := wire.XferAck{MMHash: "H", Status: wire.OK, SessionID: co.c.id, AgentMetadata: co.prod.AgentMetadata(),
		SrcBlockIndices: []wire.Int{wire.IntOf(1)}, Grant: 7, LeaseMillis: 5000}
	co.poll(at(time.Second), wire.AppendAck(nil, &ack))
	post := co.data.Posts()[0]
	if string(post.Notif) != co.c.id+":H#7" {
		t.Fatalf("notification %q", post.Notif)
	}
	co.data.Finish(post.Handle)
	// Done 6 s after the request: within our 30 s default, past the
	// producer's 5 s lease.
	res := co.poll(at(6 * time.Second))
	if len(res.tombstoned()) != 1 || res.tombstoned()[0].Reason != xfer.LateCompletion {
		t.Fatalf("READ done past the advertised lease: %+v", res)
	}
}

// withVersion re-encodes a request claiming connector version v.
func withVersion(raw []byte, v int64) []byte {
	var r wire.XferReq
	wire.DecodeReq(raw, &r)
	iv := wire.IntOf(v)
	r.ConnectorVersion = &iv
	return wire.AppendReq(nil, &r)
}
