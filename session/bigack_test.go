package session

import (
	"runtime"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// An OK ack listing more source blocks than the transfer has is refused
// (bad-ack) without decoding the list: an id costs its sender a byte and
// a decoded one 16, so a list within the client's frame cap would
// otherwise cost the consumer 16 times the frame. What handling it
// allocates stays a fraction of the ack's size.
func TestLongAckBlockListNotDecoded(t *testing.T) {
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	a := wire.XferAck{MMHash: "H", Status: wire.OK, SessionID: sidOf(co.out.msgs, "H"), AgentMetadata: co.prod.AgentMetadata()}
	a.SrcBlockIndices = make([]wire.Int, 4<<20) // 4 MiB of one-byte ids
	raw := wire.AppendAck(nil, &a)
	a.SrcBlockIndices = nil
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r := co.poll(at(time.Millisecond), raw)
	runtime.ReadMemStats(&after)
	if len(r.Failed) != 1 || r.Failed[0].Reason != xfer.BadAck {
		t.Fatalf("outcome %+v, want one bad-ack failure", r.Failed)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(len(raw))/4 {
		t.Fatalf("a %d KiB ack made the consumer allocate %d KiB", len(raw)>>10, alloc>>10)
	}
}
