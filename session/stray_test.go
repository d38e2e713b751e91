package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
)

// strayConsumer returns a session with n requests unanswered, each
// carrying a session id of its own (as against a producer that names no
// grant), and those ids in order.
func strayConsumer(tb testing.TB, n int) (*consumerOnly, []string) {
	tb.Helper()
	fab := xfake.NewFabric()
	co := &consumerOnly{data: fab.New("cons", n, 16), prod: fab.New("prod", 64, 16), out: &queue{}}
	co.c = must(NewConsumerSession(ConsumerConfig{Logger: quiet}, co.out, co.data, compat))
	co.c.ownIDs = true
	sids := make([]string, n)
	for i := range n {
		if err := co.c.StartXfer(fmt.Sprint("h", i), []int{i}, at(8*time.Hour), t0); err != nil {
			tb.Fatal(err)
		}
		var r wire.XferReq
		if err := wire.DecodeReq(co.out.msgs[len(co.out.msgs)-1], &r); err != nil {
			tb.Fatal(err)
		}
		sids[i] = r.SessionID
	}
	co.out.msgs = nil
	return co, sids
}

// Replies that name a request's mm_hash with a session id no request of
// it carries answer nothing and forget nothing; the request they do name
// is still answered after them.
func TestStrayRepliesAnswerNothing(t *testing.T) {
	const n = 64
	co, sids := strayConsumer(t, n)
	stray := [][]byte{
		nackOf("h7", co.c.id),                                // the session's id: no request of h7 carries it
		nackOf("h7", sids[3]),                                // h3's own id
		nackOf("h7", "00000000-0000-4000-8000-000000000000"), // no request's
	}
	for range 100 {
		if r := co.poll(at(1), stray...); r.Len() != 0 {
			t.Fatalf("stray replies ended transfers: %+v", r)
		}
	}
	if got := co.c.unanswered(); got != n {
		t.Fatalf("%d requests unanswered after stray replies, want %d", got, n)
	}
	r := co.poll(at(2), nackOf("h7", sids[7]))
	if len(r.Failed) != 1 || r.Failed[0].MMHash != "h7" || r.Failed[0].Status != wire.NackMissing {
		t.Fatalf("h7's own reply: %+v", r)
	}
	if got := co.c.unanswered(); got != n-8 {
		t.Fatalf("%d requests unanswered after h7's reply, want %d (those before it forgotten)", got, n-8)
	}
}

// BenchmarkStrayReply is the cost of a reply that answers nothing, by how
// many requests wait (ns/reply): matching one never scans requests it
// does not forget, so it does not grow with them.
func BenchmarkStrayReply(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 16} {
		b.Run(fmt.Sprint("unanswered=", n), func(b *testing.B) {
			co, sids := strayConsumer(b, n)
			// Many to a Poll, as a hostile producer sends them: the Poll's
			// own pass over the transfers is shared among them.
			var stray [][]byte
			for range 512 {
				stray = append(stray, nackOf(fmt.Sprint("h", n-1), co.c.id), nackOf(fmt.Sprint("h", n-1), sids[0]))
			}
			for b.Loop() {
				co.c.Poll(stray, at(1))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(stray)), "ns/reply")
			if co.c.unanswered() != n {
				b.Fatal("a stray reply answered a request")
			}
		})
	}
}

// nackOf is a NACK_MISSING for mmHash echoing session id sid.
func nackOf(mmHash, sid string) []byte {
	return wire.AppendAck(nil, &wire.XferAck{MMHash: mmHash, Status: wire.NackMissing, SessionID: sid})
}
