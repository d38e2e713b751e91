package session

import (
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A request that does not decode but still names its mm_hash and session
// gets NACK_INTERNAL at once, instead of silence the consumer would wait
// out. One that names nothing, or is another kind of message, gets nothing.
func TestUndecodableRequestIsNacked(t *testing.T) {
	po := newProducer(t)
	bad, _ := msgpack.Marshal(map[string]any{"type": "req", "mm_hash": "R", "session_id": sid("a"), "compatibility_hash": 7})
	nameless, _ := msgpack.Marshal(map[string]any{"type": "req", "compatibility_hash": 7})
	acks := po.poll(t, t0, bad, nameless, []byte{0xc1})
	if len(acks) != 1 || acks[0].Status != wire.NackInternal || acks[0].MMHash != "R" || acks[0].SessionID != sid("a") {
		t.Fatalf("acks %+v", acks)
	}
	if st := po.p.Stats(); st.Malformed != 3 || st.Nacks[wire.NackInternal] != 1 || st.Grants != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// An ack with a status this library does not know ends its transfer at
// once (bad-ack, tombstoned), not after an ack timeout and retries.
func TestUnknownAckStatusEndsTheTransfer(t *testing.T) {
	co := newConsumer(t)
	if err := co.c.StartXfer("H", []int{1}, at(2*time.Second), t0); err != nil {
		t.Fatal(err)
	}
	other, _ := msgpack.Marshal(map[string]any{"type": "ack", "mm_hash": "H", "status": 9, "session_id": "someone-else"})
	if r := co.poll(at(time.Millisecond), other); r.Len() != 0 {
		t.Fatalf("another session's ack ended ours: %+v", r)
	}
	odd, _ := msgpack.Marshal(map[string]any{"type": "ack", "mm_hash": "H", "status": 9, "session_id": co.c.id})
	r := co.poll(at(2*time.Millisecond), odd)
	if len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.BadAck || r.Len() != 1 {
		t.Fatalf("results %+v", r)
	}
	if co.c.InFlight() > 0 {
		t.Fatal("transfer still in flight")
	}
}
