package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/wirext"
)

// newLeasedProducer is newProducer with a pin lease of 5 s.
func newLeasedProducer(t *testing.T) *producerOnly {
	t.Helper()
	po := newProducer(t)
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 5 * time.Second}, po.data, po.cache, compat))
	return po
}

// A Go consumer's notification names its grant and presents its token:
// grant N's, arriving after N's lease ran out and while N+1 of the same
// key is live, matches nothing and leaves N+1 alone.
func TestLateNamedNotificationEndsNothingLive(t *testing.T) {
	po := newLeasedProducer(t)
	a := sid("a")
	first := po.poll(t, t0, goReq("R", a, 1))[0]
	po.poll(t, at(3*time.Second), goReq("R", a, 2))
	po.poll(t, at(5500*time.Millisecond)) // N's lease ends
	po.data.InjectNotif("cons", wirext.AppendNotifGrant([]byte(a+":R"), first.Grant, first.Token))
	po.poll(t, at(6*time.Second))
	if po.pins("R") != 1 || po.p.Grants() != 1 || po.p.Stats().UnknownNotifs != 1 || po.p.Stats().Completions != 0 {
		t.Fatalf("pins %d, grants %d, stats %+v", po.pins("R"), po.p.Grants(), po.p.Stats())
	}
}

// A vLLM consumer's notification names no grant: it ends the oldest live
// grant of its key. While N is live, N's late notification ends N. Once
// N's lease has run out, it cannot be told from N+1's own and ends N+1;
// a READ being served under N+1 (a data plane that authorizes READs)
// keeps the entry pinned until it is released, and over one that does
// not (NIXL) the pin goes with the grant.
func TestLateBareNotification(t *testing.T) {
	t.Run("earlier-grant-live", func(t *testing.T) {
		po := newLeasedProducer(t)
		a := sid("a")
		po.poll(t, t0, req("R", a))
		second := po.poll(t, at(3*time.Second), req("R", a))[0]
		po.data.InjectNotif("cons", []byte(a+":R")) // N's
		po.poll(t, at(4*time.Second))
		if po.pins("R") != 1 || po.p.Grants() != 1 {
			t.Fatalf("pins %d, grants %d", po.pins("R"), po.p.Grants())
		}
		if _, ok := po.p.byID[second.Grant]; !ok {
			t.Fatal("N's notification ended N+1")
		}
	})
	t.Run("earlier-grant-lapsed", func(t *testing.T) {
		po := newLeasedProducer(t)
		a := sid("a")
		po.poll(t, t0, req("R", a))
		po.poll(t, at(3*time.Second), req("R", a))
		e, _ := po.cache.Get("R")
		release, ok := po.p.authorizeRelease("cons", []byte(a+":R"), e.Blocks) // N+1's READ
		if !ok {
			t.Fatal("N+1's READ refused")
		}
		po.poll(t, at(5500*time.Millisecond)) // N's lease ends
		po.data.InjectNotif("cons", []byte(a+":R"))
		po.poll(t, at(6*time.Second))
		if po.p.Stats().Completions != 1 || len(po.p.byID) != 0 {
			t.Fatalf("N's late notification: stats %+v", po.p.Stats())
		}
		if po.pins("R") != 1 {
			t.Fatalf("the entry unpinned under the READ being served: pins %d", po.pins("R"))
		}
		release()
		if po.pins("R") != 0 {
			t.Fatalf("after the READ's release: pins %d", po.pins("R"))
		}
	})
}

// A vLLM consumer sends no ecx_agent: the producer cannot tell its agent
// from another until a notification of its session arrives, and binds the
// session to the agent of that first one. From then on another agent's
// notification is refused and ends nothing. Before it, another agent's
// notification of the session's key is indistinguishable from the
// consumer's: it ends the oldest grant and binds the session to itself,
// and the consumer's own notifications are then refused, its grants
// ending by lease.
func TestNotificationFromAnotherAgentWithoutAgentName(t *testing.T) {
	for _, first := range []string{"cons", "intruder"} {
		t.Run(fmt.Sprint("first=", first), func(t *testing.T) {
			po := newLeasedProducer(t)
			a := sid("a")
			po.poll(t, t0, req("R", a), req("R", a))
			po.data.InjectNotif(first, []byte(a+":R"))
			po.poll(t, at(time.Second))
			if po.pins("R") != 1 || po.p.Stats().Completions != 1 {
				t.Fatalf("the first notification: pins %d", po.pins("R"))
			}
			other := map[string]string{"cons": "intruder", "intruder": "cons"}[first]
			po.data.InjectNotif(other, []byte(a+":R"))
			po.poll(t, at(2*time.Second))
			if po.pins("R") != 1 || po.p.Stats().ForeignNotifs != 1 {
				t.Fatalf("another agent's: pins %d, stats %+v", po.pins("R"), po.p.Stats())
			}
			po.poll(t, at(5*time.Second+time.Millisecond))
			if po.pins("R") != 0 || po.p.Grants() != 0 {
				t.Fatalf("after the lease: pins %d", po.pins("R"))
			}
		})
	}
}
