package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A session id is a name the consumer states. A peer that states another
// consumer's, from another control-plane connection, stating its agent or
// none, gets grants whose READs bind its data connection to no consumer
// session: it never takes the other's pushes. The consumer's own grants
// still bind.
func TestStatedSessionIDTakesNoPushes(t *testing.T) {
	for _, agent := range []string{"", "victim-agent"} {
		t.Run(fmt.Sprintf("agent %q", agent), func(t *testing.T) {
			po, f := newPlaneProducer(t)
			f.take()
			victim := sid("victim")
			ask := func(ident, agent string, attempt uint64) wire.XferAck {
				t.Helper()
				acks := po.poll2(t, t0, xfer.Message{Identity: []byte(ident), Payload: wire.AppendReq(nil,
					&wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: victim, Attempt: attempt, Agent: agent})})
				if len(acks) != 1 || acks[0].Status != wire.OK || acks[0].Token.IsZero() {
					t.Fatalf("acks %+v", acks)
				}
				return acks[0]
			}
			own := ask("victim-ident", "victim-agent", 1)
			stated := ask("other-ident", agent, 99)
			again := ask("victim-ident", "victim-agent", 2)
			e, _ := po.cache.Get("R")
			consumer := func(a wire.XferAck) uint64 {
				t.Helper()
				h, ok := f.att.gate.Authorize("victim-agent", fmt.Appendf(nil, "%s:R#%d.%x", victim, a.Grant, a.Token), e.Blocks)
				if !ok {
					t.Fatalf("grant %d refused", a.Grant)
				}
				h.Release()
				return h.Consumer
			}
			if c := consumer(own); c == 0 {
				t.Fatal("the consumer's own grant names no session")
			}
			if c := consumer(again); c != consumer(own) {
				t.Fatalf("the consumer's grants name sessions %d and %d", consumer(own), c)
			}
			if c := consumer(stated); c != 0 {
				t.Fatalf("a grant asked for under a stated session id names session %d: its READs' connection would take that session's pushes", c)
			}
		})
	}
}

// Requests from many new consumer sessions, each keeping a grant, cost
// the forgetting of idle sessions a scan each time their number doubles,
// not one per request.
func TestManySessionsScanRarely(t *testing.T) {
	pc := cache.NewEmbeddingCache(16)
	pc.Alloc("R", 2)
	pc.MarkReady("R")
	p := must(NewProducerSession(ProducerConfig{Logger: quiet}, xfake.New("prod", 16, 8), pc, compat))
	defer p.Close()
	out := &queue{}
	const n = 16384
	var msgs []xfer.Message
	for i := range n {
		s := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
		msgs = append(msgs, xfer.Message{Identity: []byte("c"), Payload: wire.AppendReq(nil,
			&wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: s, Attempt: uint64(i + 1)})})
		if len(msgs) == 1024 {
			p.Poll(msgs, out, t0.Add(time.Millisecond))
			msgs = msgs[:0]
			out.take()
		}
	}
	if p.Grants() != n || len(p.consumers) != n {
		t.Fatalf("grants %d, consumer sessions %d, want %d", p.Grants(), len(p.consumers), n)
	}
	// The first scan comes at 4*MaxGrants/MaxGrantsPerSession+1024 sessions
	// (1,088), then at each doubling: 2,176, 4,352, 8,704.
	if p.prunes > 4 {
		t.Fatalf("%d scans of the consumer sessions for %d new ones, each keeping a grant", p.prunes, n)
	}
}
