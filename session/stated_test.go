package session

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A session id is a name the consumer states. Whatever another peer does
// with it (states it before the consumer does, or after, or once the
// producer forgot the session, from another control-plane identity,
// stating the consumer's agent or none), the consumer's grants are pushed
// only where its own grants' READs bind their connections, never where
// the other's do; and a consumer that comes back under a new identity is
// pushed to where its new grants bind.
func TestStatedSessionIDTakesNoPushes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		first  bool // the other peer asks first
		forget bool // the producer forgets the session in between
		agent  string
	}{
		{"after the consumer", false, false, ""},
		{"after the consumer, stating its agent", false, false, "victim-agent"},
		{"before the consumer", true, false, ""},
		{"once the session was forgotten", true, true, "victim-agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			po, f := newPlaneProducer(t)
			victim := sid("victim")
			now := t0
			attempt := uint64(0)
			// ask returns the ack, where its grant's READs bind their
			// connection, and where its blocks were pushed (0: nowhere).
			ask := func(ident, agent string) (bind, pushed uint64) {
				t.Helper()
				f.take()
				attempt++
				acks := po.poll2(t, now, xfer.Message{Identity: []byte(ident), Payload: wire.AppendReq(nil,
					&wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: victim, Attempt: attempt, Agent: agent})})
				if len(acks) != 1 || acks[0].Status != wire.OK || acks[0].Token.IsZero() {
					t.Fatalf("acks %+v", acks)
				}
				a := acks[0]
				for _, e := range f.take() {
					var c, g uint64
					if strings.HasPrefix(e, "push ") {
						fmt.Sscanf(e, "push %d", &c)
						fmt.Sscanf(e[strings.Index(e, "#")+1:], "%d", &g)
						if g == a.Grant {
							pushed = c
						}
					}
				}
				e, _ := po.cache.Get("R")
				// A data connection's agent name is a label: the other
				// peer's hello states the consumer's.
				h, ok := f.att.gate.Authorize("victim-agent", fmt.Appendf(nil, "%s:R#%d.%x", victim, a.Grant, a.Token), e.Blocks)
				if !ok {
					t.Fatalf("grant %d refused", a.Grant)
				}
				h.Release()
				return h.Consumer, pushed
			}
			others := map[uint64]bool{0: true}
			if tc.first {
				if tc.forget {
					ask("victim-ident", "victim-agent") // the consumer's session, forgotten below
					now = now.Add(11 * time.Second)     // past the lease: its grant ends
					var msgs []xfer.Message
					for i := range 1100 {
						s := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
						msgs = append(msgs, xfer.Message{Identity: []byte("flood"), Payload: wire.AppendReq(nil,
							&wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: s, Attempt: uint64(100 + i)})})
					}
					po.p.Poll(msgs, po.out, now)
					po.out.take()
					now = now.Add(11 * time.Second)
					po.p.Poll(nil, po.out, now)
				}
				b, _ := ask("other-ident", tc.agent)
				others[b] = true
			}
			own := map[uint64]bool{}
			for range 2 {
				b, pushed := ask("victim-ident", "victim-agent")
				if b == 0 || others[b] {
					t.Fatalf("the consumer's grant binds %d (the other's: %v)", b, others)
				}
				own[b] = true
				if pushed != 0 && !own[pushed] {
					t.Fatalf("the consumer's grant was pushed to %d, where its own grants bind %v", pushed, own)
				}
			}
			if !tc.first {
				b, pushed := ask("other-ident", tc.agent)
				if own[b] || own[pushed] {
					t.Fatalf("the other's grant binds %d, pushed to %d: the consumer's (%v)", b, pushed, own)
				}
			}
			// The consumer comes back under a new identity, same session.
			b, pushed := ask("victim-ident-2", "victim-agent")
			if b == 0 || others[b] || (pushed != 0 && pushed != b) {
				t.Fatalf("under a new identity the consumer's grant binds %d and was pushed to %d", b, pushed)
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
