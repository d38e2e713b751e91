package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A session that pins entry after entry, never letting go, is refused
// (NACK_NOT_READY, counted OverPinned) at the pin that would leave the
// encoder's next save no room, whether no save is under way or one is:
// the reserve is the largest save seen, or SaveReserve when larger. That
// save then succeeds.
func TestGreedySessionLeavesRoomForTheNextSave(t *testing.T) {
	for _, tc := range []struct {
		name          string
		reserve, save int // SaveReserve, and the save made after the refusal
		underWay      bool
	}{
		{"largest save", 0, 2, false},
		{"largest save, a save under way", 0, 2, true},
		{"configured reserve", 6, 6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cache.NewEmbeddingCache(16)
			po := &producerOnly{data: xfake.New("prod", 16, 8), cache: c, out: &queue{}}
			po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, SaveReserve: tc.reserve}, po.data, c, compat))
			if tc.underWay {
				if _, err := c.Alloc("under-way", 2); err != nil {
					t.Fatal(err)
				}
			}
			greedy := sid("greedy")
			refused := ""
			for i := 0; refused == ""; i++ {
				if i > 16 {
					t.Fatal("the greedy session was never refused")
				}
				key := fmt.Sprint("E", i)
				if _, err := c.Alloc(key, 2); err != nil {
					t.Fatalf("save %d failed while the greedy session pins: %v", i, err)
				}
				c.MarkReady(key)
				switch ack := po.poll(t, at(time.Duration(i)*time.Millisecond), req(key, greedy))[0]; ack.Status {
				case wire.OK:
				case wire.NackNotReady:
					refused = key
				default:
					t.Fatalf("%s: %s", key, ack.Status)
				}
			}
			if st := po.p.Stats(); st.OverPinned != 1 || po.pins(refused) != 0 {
				t.Fatalf("refusal of %s: OverPinned %d, %d pins left", refused, st.OverPinned, po.pins(refused))
			}
			if _, err := c.Alloc("next", tc.save); err != nil {
				t.Fatalf("the save after the refusal: %v", err)
			}
		})
	}
}

// withinShare drives a consumer session that keeps 4 entries of 2 blocks
// pinned, its share of a 16-block cache, through many entries while the
// encoder saves one after another, each save under way as the consumer
// asks for the last: a save as large as half the cache was seen, so every
// pin of the consumer's leaves less room than that. A consumer within its
// share is refused nothing. goConsumer: requests name their attempt and
// notifications their grant and token; else they are vLLM's (the bare
// key, which ends the oldest grant of the key), and the consumer asks
// again, now and then, for an entry it holds, as vLLM does when an ack is
// late.
func withinShare(t *testing.T, goConsumer bool) {
	c := cache.NewEmbeddingCache(16)
	if _, err := c.Alloc("large", 8); err != nil {
		t.Fatal(err)
	}
	c.Discard("large")
	po := &producerOnly{data: xfake.New("prod", 16, 8), cache: c, out: &queue{}}
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, po.data, c, compat))
	s := sid("consumer")
	type held struct {
		key    string
		notifs [][]byte // one per grant
	}
	var live []held // oldest first
	now := t0
	release := func() {
		for _, n := range live[0].notifs {
			po.data.InjectNotif("cons", n)
		}
		live = live[1:]
	}
	ask := func(key string, attempt uint64) []byte {
		raw := req(key, s)
		if goConsumer {
			raw = goReq(key, s, attempt)
		}
		msg := xfer.Message{Identity: []byte("consumer"), Payload: raw}
		ack := po.poll2(t, now, msg)[0]
		if ack.Status != wire.OK {
			t.Fatalf("%s: %s with %d entries pinned, stats %+v", key, ack.Status, len(live), po.p.Stats())
		}
		if e, _ := c.Get(key); len(ack.SrcBlockIndices) != len(e.Blocks) {
			t.Fatalf("%s: %d blocks granted, the entry has %d", key, len(ack.SrcBlockIndices), len(e.Blocks))
		}
		if goConsumer {
			return wirext.AppendNotifGrant([]byte(s+":"+key), ack.Grant, ack.Token)
		}
		return []byte(s + ":" + key)
	}
	if _, err := c.Alloc("E0", 2); err != nil {
		t.Fatal(err)
	}
	const entries = 400
	for i := range entries {
		now = now.Add(time.Millisecond)
		key, next := fmt.Sprint("E", i), fmt.Sprint("E", i+1)
		c.MarkReady(key)
		if _, err := c.Alloc(next, 2); err != nil {
			t.Fatalf("save of %s: %v", next, err)
		}
		if len(live) == 4 {
			release() // the notification lands before the next fetch
		}
		live = append(live, held{key, [][]byte{ask(key, uint64(2*i+1))}})
		if !goConsumer && i%7 == 3 {
			h := &live[len(live)-1]
			h.notifs = append(h.notifs, ask(key, 0))
		}
	}
	for len(live) > 0 {
		release()
	}
	po.p.Poll(nil, po.out, now.Add(time.Millisecond))
	st := po.p.Stats()
	var nacks uint64
	for _, n := range st.Nacks {
		nacks += n
	}
	if nacks != 0 || st.OverPinned != 0 || po.p.Grants() != 0 {
		t.Fatalf("refusals %d (over share %d), grants left %d", nacks, st.OverPinned, po.p.Grants())
	}
	if cs := po.p.consumers[s]; cs.blocks != 0 || len(po.p.idents) != 0 {
		t.Fatalf("shares left counted: session %d, identities %v", cs.blocks, po.p.idents)
	}
}

// A consumer pinning within its share is never refused a ready entry,
// however little room its pins leave the encoder's saves.
func TestWithinShareNeverRefused(t *testing.T) { withinShare(t, true) }

// Nor is a vLLM consumer: one session id, many entries, bare
// notifications, and re-requests of entries it holds.
func TestVLLMConsumerWithinShareNeverRefused(t *testing.T) { withinShare(t, false) }
