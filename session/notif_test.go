package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
)

// newLeasedProducer is newProducer with a pin lease of 5 s.
func newLeasedProducer(t *testing.T) *producerOnly {
	t.Helper()
	po := newProducer(t)
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 5 * time.Second}, po.data, po.cache, compat))
	return po
}

// A vLLM consumer's notification names no grant: it ends the oldest grant
// of its key. Grant N's lease runs out while grant N+1 of the same key
// (same session, same mm_hash) is live; then N's notification arrives, its
// READ having ended late. It is N's: it ends nothing live, and N+1 stays
// pinned until its own notification.
func TestLateNotificationOfLapsedGrantEndsNothingLive(t *testing.T) {
	po := newLeasedProducer(t)
	a := sid("a")
	if acks := po.poll(t, t0, req("R", a)); acks[0].Status != wire.OK {
		t.Fatalf("%+v", acks)
	}
	if acks := po.poll(t, at(3*time.Second), req("R", a)); acks[0].Status != wire.OK {
		t.Fatalf("%+v", acks)
	}
	po.poll(t, at(5500*time.Millisecond)) // N's lease ends
	if po.pins("R") != 1 || po.p.Stats().Expired != 1 {
		t.Fatalf("pins %d, expired %d", po.pins("R"), po.p.Stats().Expired)
	}
	po.data.InjectNotif("cons", []byte(a+":R")) // N's, late
	po.poll(t, at(6*time.Second))
	if po.pins("R") != 1 || po.p.Grants() != 1 {
		t.Fatalf("N's late notification ended N+1: pins %d, grants %d", po.pins("R"), po.p.Grants())
	}
	if st := po.p.Stats(); st.LateNotifs != 1 || st.Completions != 0 {
		t.Fatalf("stats %+v", st)
	}
	po.data.InjectNotif("cons", []byte(a+":R")) // N+1's
	po.poll(t, at(7*time.Second))
	if po.pins("R") != 0 || po.p.Grants() != 0 || po.p.Stats().Completions != 1 {
		t.Fatalf("N+1's notification: pins %d, grants %d", po.pins("R"), po.p.Grants())
	}
}

// The cost of that rule: when N's READ never ran, N+1's notification is
// taken for N's, and N+1 holds its pin until its lease, never less. A
// record of a lapsed grant is kept for twice the lease; notifications of
// other keys, and of grants that name themselves, do not touch it.
func TestLapsedGrantRecordCostsOnlyPinTime(t *testing.T) {
	po := newLeasedProducer(t)
	a, b := sid("a"), sid("b")
	po.poll(t, t0, req("R", a))
	second := po.poll(t, at(3*time.Second), req("R", a), goReq("R", b, 1))
	po.poll(t, at(5500*time.Millisecond)) // N's lease ends
	po.data.InjectNotif("cons", wire.AppendNotifGrant([]byte(b+":R"), second[1].Grant, second[1].Token))
	po.data.InjectNotif("cons", []byte(a+":R")) // N+1's own
	po.poll(t, at(6*time.Second))
	if po.pins("R") != 1 || po.p.Grants() != 1 || po.p.Stats().Completions != 1 {
		t.Fatalf("pins %d, grants %d", po.pins("R"), po.p.Grants())
	}
	po.poll(t, at(8*time.Second+time.Millisecond)) // N+1's lease ends
	if po.pins("R") != 0 || po.p.Grants() != 0 {
		t.Fatalf("after N+1's lease: pins %d, grants %d", po.pins("R"), po.p.Grants())
	}
	// Twice the lease after N+1 lapsed its record is gone: a bare
	// notification is then unknown, and a new grant ends by it.
	po.poll(t, at(18*time.Second+2*time.Millisecond))
	po.poll(t, at(19*time.Second), req("R", a))
	po.data.InjectNotif("cons", []byte(a+":R"))
	po.poll(t, at(19*time.Second+time.Millisecond))
	if po.pins("R") != 0 || po.p.Grants() != 0 {
		t.Fatalf("a record outlived twice the lease: pins %d", po.pins("R"))
	}
	if len(po.p.lapsed) != 0 {
		t.Fatalf("records left: %v", po.p.lapsed)
	}
}

// A Go consumer's notification names its grant: N's, after N's lease ran
// out, matches nothing and leaves N+1 alone, whatever its token.
func TestLateNamedNotificationEndsNothingLive(t *testing.T) {
	po := newLeasedProducer(t)
	a := sid("a")
	first := po.poll(t, t0, goReq("R", a, 1))[0]
	po.poll(t, at(3*time.Second), goReq("R", a, 2))
	po.poll(t, at(5500*time.Millisecond))
	po.data.InjectNotif("cons", wire.AppendNotifGrant([]byte(a+":R"), first.Grant, first.Token))
	po.poll(t, at(6*time.Second))
	if po.pins("R") != 1 || po.p.Grants() != 1 || po.p.Stats().UnknownNotifs != 1 {
		t.Fatalf("pins %d, grants %d, stats %+v", po.pins("R"), po.p.Grants(), po.p.Stats())
	}
}

// A vLLM consumer sends no ecx_agent: the producer cannot tell its agent
// from another until a notification of its session arrives, and binds the
// session to the agent of that first one. From then on another agent's
// notification is refused and ends nothing. Before it, another agent's
// notification of the session's key is indistinguishable from the
// consumer's: it ends the oldest grant and binds the session to itself,
// and the consumer's own notifications then end nothing, their grants
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
