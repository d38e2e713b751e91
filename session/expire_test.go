package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
)

// A burst of requests its producer never answers: once the producer is
// known to name the request each reply answers, the records of those
// unanswered past their ack deadline are forgotten, so a burst leaves
// nothing behind; a producer that names none keeps them (a late reply,
// matched by order, would be taken for a later request's), within the
// bound of 16 per mm_hash and 2^20 in all.
func TestUnansweredRecordsExpire(t *testing.T) {
	for _, echoes := range []bool{true, false} {
		t.Run(fmt.Sprint("echoes=", echoes), func(t *testing.T) {
			co := newConsumer(t)
			// One request answered first: an echoing producer names its attempt.
			mustStart(t, co.c, "first", []int{1}, at(time.Second))
			first := co.lastAttempt(t) // the burst's are the next ones: attempts number every request of the process
			a := wire.XferAck{MMHash: "first", Status: wire.NackMissing}
			if echoes {
				a.Attempt = co.lastAttempt(t)
			}
			co.poll(t0, encAck(a))
			const burst = 5000
			for i := range burst {
				mustStart(t, co.c, fmt.Sprint("h", i), []int{1}, at(time.Second))
			}
			if co.c.unanswered() != burst {
				t.Fatalf("%d unanswered", co.c.unanswered())
			}
			co.poll(at(time.Second))
			if co.c.unanswered() != burst {
				t.Fatal("forgotten at, not after, the ack deadline")
			}
			r := co.poll(at(time.Second + time.Millisecond))
			if len(r.Failed) != burst {
				t.Fatalf("%d of %d timed out", len(r.Failed), burst)
			}
			want := 0
			if !echoes {
				want = burst
			}
			if co.c.unanswered() != want || len(co.c.perHash) != want {
				t.Fatalf("echoes %v: %d records kept (%d hashes), want %d", echoes, co.c.unanswered(), len(co.c.perHash), want)
			}
			// A late reply to a forgotten request acts on nothing.
			if echoes {
				mustStart(t, co.c, "h7", []int{1}, at(3*time.Second))
				late := wire.XferAck{MMHash: "h7", Status: wire.OK, SessionID: co.c.id, AgentMetadata: co.prod.AgentMetadata(),
					SrcBlockIndices: []wire.Int{wire.IntOf(2)}, Attempt: first + 8} // the first request for h7
				if r := co.poll(at(2*time.Second), encAck(late)); r.Len() != 0 || co.c.Stats().StrayAcks == 0 {
					t.Fatalf("a late reply acted: %+v", r)
				}
				if len(co.data.Posts()) != 0 {
					t.Fatal("a READ was posted for a forgotten request's reply")
				}
			}
		})
	}
}
