package session

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

// pushFake is a data plane that pushes (xfer.Pusher): it records each
// offer with the pins and replies at the time, and keeps the holds it
// took for the test to end.
type pushFake struct {
	*xfertest.Fake
	po       *producerOnly
	refuse   bool
	events   []string
	releases []func()
}

func (f *pushFake) Push(agent string, notif []byte, blocks []int, release func()) bool {
	f.events = append(f.events, fmt.Sprintf("push %s %s %v pins %d replies %d", agent, notif, blocks, f.po.pins("R"), len(f.po.out.msgs)))
	if f.refuse {
		return false
	}
	f.releases = append(f.releases, release)
	return true
}

func (f *pushFake) take() []string { e := f.events; f.events = nil; return e }

func agentReq(h, sid, agent string) []byte {
	return wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: sid, Agent: agent})
}

// A grant is offered for a push once its ack is out, only to a consumer
// that named its agent and holds few grants; a push's hold keeps the pin
// after the grant ends, until the data plane releases it; a refused
// offer holds nothing.
func TestPushOffer(t *testing.T) {
	po := &producerOnly{cache: cache.NewEmbeddingCache(16), out: &queue{}}
	po.cache.Alloc("R", 2)
	po.cache.MarkReady("R")
	f := &pushFake{Fake: xfertest.New("prod", 16, 8), po: po}
	po.data = f.Fake
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 10 * time.Second}, f, po.cache, compat))
	check := func(what string, want ...string) {
		t.Helper()
		if got := f.take(); !slices.Equal(got, want) {
			t.Fatalf("%s: %q, want %q", what, got, want)
		}
	}
	e, _ := po.cache.Get("R")
	blocks := fmt.Sprint(e.Blocks)

	po.poll(t, t0, req("R", sid("a")))
	check("no agent named") // a Python consumer: nothing to push to
	po.out.msgs = nil
	acks := po.poll(t, t0, agentReq("R", sid("b"), "cons-b"))
	check("granted", fmt.Sprintf("push cons-b %s:R#%d %s pins 2 replies 1", sid("b"), acks[0].Grant, blocks))
	po.out.msgs = nil
	po.poll(t, t0, agentReq("R", sid("b"), "cons-b"))
	check("second grant of the session", fmt.Sprintf("push cons-b %s:R#%d %s pins 3 replies 1", sid("b"), acks[0].Grant+1, blocks))
	po.out.msgs = nil
	po.poll(t, t0, agentReq("R", sid("b"), "cons-b"))
	check("third grant: the session has many") // READs do it
	po.out.msgs = nil
	po.poll(t, t0, agentReq("Absent", sid("c"), "cons-c"))
	check("refused request")

	// Every grant ends (lease); the pushes' holds keep the pin.
	po.poll(t, at(time.Minute))
	if n := po.pins("R"); n != 2 {
		t.Fatalf("pins %d after the leases, want 2 (the pushes' holds)", n)
	}
	for _, r := range f.releases {
		r()
	}
	po.poll(t, at(2*time.Minute))
	if n := po.pins("R"); n != 0 {
		t.Fatalf("pins %d after the pushes ended", n)
	}

	f.refuse = true
	po.out.msgs = nil
	acks = po.poll(t, at(3*time.Minute), agentReq("R", sid("d"), "cons-d"))
	check("offer refused", fmt.Sprintf("push cons-d %s:R#%d %s pins 1 replies 1", sid("d"), acks[0].Grant, blocks))
	po.poll(t, at(4*time.Minute))
	if n := po.pins("R"); n != 0 {
		t.Fatalf("pins %d: a refused offer kept a hold", n)
	}
	if s := po.p.Stats(); s.Pushes != 2 {
		t.Fatalf("stats: %d pushes, want 2", s.Pushes)
	}
}
