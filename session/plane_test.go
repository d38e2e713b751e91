package session

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// planeFake is a data plane that serves READs through the gate of the
// session attached to it (plane.Attacher), as the TCP plane does. It
// records each call with the entry's pins and the replies sent so far, and
// keeps the pushes' holds for the test to end.
type planeFake struct {
	*xfake.Fake
	po       *producerOnly
	att      *fakeAttachment
	refuse   bool // pushes
	events   []string
	releases []func()
}

type fakeAttachment struct {
	f        *planeFake
	gate     plane.Gate
	detached bool
	broken   []xfer.Notif // for Broken
}

func (f *planeFake) Attach(g plane.Gate) plane.Attachment {
	if f.att != nil {
		f.att.detached = true
	}
	f.att = &fakeAttachment{f: f, gate: g}
	f.events = append(f.events, "attach")
	return f.att
}

func (a *fakeAttachment) log(format string, args ...any) {
	if a.detached {
		format = "detached: " + format
	}
	a.f.events = append(a.f.events, fmt.Sprintf(format, args...))
}

func (a *fakeAttachment) Publish(id uint64) {
	a.log("publish %d pins %d replies %d", id, a.f.po.pins("R"), len(a.f.po.out.msgs))
}

func (a *fakeAttachment) Retire(id uint64) { a.log("retire %d pins %d", id, a.f.po.pins("R")) }

func (a *fakeAttachment) Push(consumer uint64, notif []byte, blocks []int, release func()) bool {
	a.log("push %d %s %v pins %d replies %d", consumer, notif, blocks, a.f.po.pins("R"), len(a.f.po.out.msgs))
	if a.f.refuse {
		return false
	}
	a.f.releases = append(a.f.releases, release)
	return true
}

func (a *fakeAttachment) OnNotify(func() bool) {}

func (a *fakeAttachment) Broken(dst []xfer.Notif) []xfer.Notif {
	dst = append(dst, a.broken...)
	a.broken = nil
	return dst
}

func (a *fakeAttachment) Detach() {
	a.log("detach pins %d", a.f.po.pins("R"))
	a.detached = true
}

func (f *planeFake) take() []string { e := f.events; f.events = nil; return e }

func newPlaneProducer(t *testing.T) (*producerOnly, *planeFake) {
	t.Helper()
	po := &producerOnly{cache: cache.NewEmbeddingCache(16), out: &queue{}}
	po.cache.Alloc("R", 2)
	po.cache.MarkReady("R")
	f := &planeFake{Fake: xfake.New("prod", 16, 8), po: po}
	po.data = f.Fake
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 10 * time.Second}, f, po.cache, compat))
	return po, f
}

func (f *planeFake) check(t *testing.T, what string, want ...string) {
	t.Helper()
	if got := f.take(); !slices.Equal(got, want) {
		t.Fatalf("%s: %q, want %q", what, got, want)
	}
}

// A session attaches as it starts. It publishes each grant before its ack
// leaves and retires it while its pin is still held, however the grant
// ends (notification, lease); Close detaches before any pin goes.
func TestAttachedGrantOrder(t *testing.T) {
	po, f := newPlaneProducer(t)
	f.check(t, "start", "attach")
	acks := po.poll(t, t0, req("R", sid("a")))
	g := acks[0].Grant
	f.check(t, "grant", fmt.Sprintf("publish %d pins 1 replies 0", g))
	f.InjectNotif("", fmt.Appendf(nil, "%s:R#%d", sid("a"), g))
	po.poll(t, at(time.Second))
	f.check(t, "notification", fmt.Sprintf("retire %d pins 1", g))
	if po.pins("R") != 0 {
		t.Fatal("the notification did not unpin")
	}
	g = po.poll(t, at(2*time.Second), req("R", sid("b")))[0].Grant
	po.poll(t, at(13*time.Second))
	f.check(t, "lease", fmt.Sprintf("publish %d pins 1 replies 0", g), fmt.Sprintf("retire %d pins 1", g))
	g = po.poll(t, at(14*time.Second), req("R", sid("c")))[0].Grant
	po.p.Close()
	f.check(t, "close", fmt.Sprintf("publish %d pins 1 replies 0", g), "detach pins 1")
	if po.pins("R") != 0 || po.p.Grants() != 0 {
		t.Fatalf("after Close: pins %d, grants %d", po.pins("R"), po.p.Grants())
	}
	// A session on the same plane attaches anew; the closed one acts on
	// it no more.
	next := must(NewProducerSession(ProducerConfig{Logger: quiet}, f, po.cache, compat))
	f.check(t, "replaced", "attach")
	po.poll(t, at(15*time.Second), req("R", sid("d")))
	f.check(t, "the closed session granted nothing")
	next.Close()
}

// A grant is offered for a push once its ack is out, only to a Go
// consumer (its grants carry tokens) that holds few grants, naming its
// consumer session; a push's hold keeps the pin after the grant ends,
// until the data plane releases it; a refused offer holds nothing.
func TestPushOffer(t *testing.T) {
	po, f := newPlaneProducer(t)
	f.take()
	e, _ := po.cache.Get("R")
	blocks := fmt.Sprint(e.Blocks)
	po.poll(t, t0, req("R", sid("a")))
	f.check(t, "a reference consumer", fmt.Sprintf("publish %d pins 1 replies 0", lastGrant(t, po)))
	po.out.msgs = nil
	ack := po.poll(t, t0, goReq("R", sid("b"), 1))[0]
	key := fmt.Sprintf("%s:R#%d.%x", sid("b"), ack.Grant, ack.Token)
	f.check(t, "granted", fmt.Sprintf("publish %d pins 2 replies 0", ack.Grant), fmt.Sprintf("push 2 %s %s pins 2 replies 1", key, blocks))
	po.out.msgs = nil
	ack = po.poll(t, t0, goReq("R", sid("b"), 2))[0]
	key = fmt.Sprintf("%s:R#%d.%x", sid("b"), ack.Grant, ack.Token)
	f.check(t, "second grant of the session", fmt.Sprintf("publish %d pins 3 replies 0", ack.Grant), fmt.Sprintf("push 2 %s %s pins 3 replies 1", key, blocks))
	po.out.msgs = nil
	ack = po.poll(t, t0, goReq("R", sid("b"), 3))[0]
	f.check(t, "third grant: the session has many", fmt.Sprintf("publish %d pins 4 replies 0", ack.Grant)) // READs do it
	po.out.msgs = nil
	po.poll(t, t0, goReq("Absent", sid("c"), 1))
	f.check(t, "refused request")

	// Every grant ends (lease); the pushes' holds keep the pin.
	po.poll(t, at(time.Minute))
	f.take()
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
	po.poll(t, at(3*time.Minute), goReq("R", sid("d"), 1))
	f.take()
	po.poll(t, at(4*time.Minute))
	if n := po.pins("R"); n != 0 {
		t.Fatalf("pins %d: a refused offer kept a hold", n)
	}
	if s := po.p.Stats(); s.Pushes != 2 {
		t.Fatalf("stats: %d pushes, want 2", s.Pushes)
	}
}

func lastGrant(t *testing.T, po *producerOnly) uint64 {
	t.Helper()
	return po.p.lru.prev.id
}

// On a data plane that lets any peer READ (NIXL, and xfertest's fake), a
// READ under a live grant may still be running when the producer closes,
// and nothing can stop it: Close leaves the grants' entries pinned until
// their notifications or leases, which later Polls see to.
func TestCloseKeepsPinsOnAPlaneThatCannotRefuse(t *testing.T) {
	po := newProducer(t)
	a, b := sid("a"), sid("b")
	po.poll(t, t0, req("R", a))
	po.poll(t, t0, req("R", b))
	if err := po.p.Close(); err != nil || po.p.Grants() != 2 || po.pins("R") != 2 {
		t.Fatalf("Close: %v, %d grants, pins %d", err, po.p.Grants(), po.pins("R"))
	}
	// No new grant after Close, however it is asked for.
	po.poll(t, at(time.Second), req("R", sid("c")))
	if po.pins("R") != 2 {
		t.Fatalf("pins %d after a request to a closed session", po.pins("R"))
	}
	po.data.InjectNotif("cons", []byte(a+":R"))
	po.poll(t, at(2*time.Second))
	if po.pins("R") != 1 || po.p.Grants() != 1 {
		t.Fatalf("the notification after Close: pins %d grants %d", po.pins("R"), po.p.Grants())
	}
	po.poll(t, at(time.Minute))
	if po.pins("R") != 0 || po.p.Grants() != 0 {
		t.Fatalf("the lease after Close: pins %d grants %d", po.pins("R"), po.p.Grants())
	}
}

// A READ the data plane served on a connection that closed before the
// consumer confirmed it cannot complete: the plane says so (Broken), and
// the session ends the grant at its next Poll instead of at its lease,
// if the notification names the grant with its token and comes from the
// grant's agent. A bare key, a wrong token or another agent end nothing.
func TestBrokenReadEndsItsGrant(t *testing.T) {
	po, f := newPlaneProducer(t)
	raw := wire.AppendReq(nil, &wire.XferReq{MMHash: "R", CompatibilityHash: compat, SessionID: sid("a"), Attempt: 1, Agent: "cons"})
	ack := po.poll(t, t0, raw)[0]
	if ack.Status != wire.OK || po.pins("R") != 1 {
		t.Fatalf("ack %+v, pins %d", ack, po.pins("R"))
	}
	f.take()
	key := sid("a") + ":R"
	named := wirext.AppendNotifGrant([]byte(key), ack.Grant, ack.Token)
	wrong := ack.Token
	wrong[0] ^= 1
	f.att.broken = []xfer.Notif{
		{Agent: "cons", Msg: []byte(key)},
		{Agent: "cons", Msg: wirext.AppendNotifGrant([]byte(key), ack.Grant, wrong)},
		{Agent: "other", Msg: named},
	}
	po.poll(t, at(time.Second))
	if po.pins("R") != 1 || po.p.Grants() != 1 || po.p.Stats().BrokenReads != 0 {
		t.Fatalf("ended by a notification that does not name it with its token from its agent: pins %d", po.pins("R"))
	}
	f.att.broken = []xfer.Notif{{Agent: "cons", Msg: named}, {Agent: "cons", Msg: named}}
	po.poll(t, at(2*time.Second))
	f.check(t, "retired", fmt.Sprintf("retire %d pins 1", ack.Grant))
	if st := po.p.Stats(); st.BrokenReads != 1 || st.Completions != 0 || len(po.p.byID) != 0 {
		t.Fatalf("after its READ broke: %d live grants, stats %+v", len(po.p.byID), st)
	}
	// The grant's push, under way, holds the pin until its bytes are out.
	if len(f.releases) != 1 || po.pins("R") != 1 {
		t.Fatalf("pushes %d, pins %d", len(f.releases), po.pins("R"))
	}
	f.releases[0]()
	po.poll(t, at(3*time.Second))
	if po.pins("R") != 0 || po.p.Grants() != 0 {
		t.Fatalf("after the push: pins %d, grants %d", po.pins("R"), po.p.Grants())
	}
}

// On a plane that serves through the session's gate, a Go consumer's
// contact request gets a grant of no blocks: it pins nothing, a READ of
// blocks under it is refused, a READ of none is served, and its
// notification ends it.
func TestContactGrant(t *testing.T) {
	po, f := newPlaneProducer(t)
	f.take()
	raw := wire.AppendReq(nil, &wire.XferReq{MMHash: wirext.ContactHash, CompatibilityHash: compat, SessionID: sid("a"),
		Attempt: 3, Agent: "cons", Contact: true})
	ack := po.poll(t, t0, raw)[0]
	if ack.Status != wire.OK || ack.Grant == 0 || ack.Token.IsZero() || len(ack.SrcBlockIndices) != 0 || ack.Attempt != 3 {
		t.Fatalf("contact answer %+v", ack)
	}
	if po.pins("R") != 0 || po.p.Grants() != 1 {
		t.Fatalf("pins %d, grants %d", po.pins("R"), po.p.Grants())
	}
	f.check(t, "no publish, no push")
	notif := wirext.AppendNotifGrant([]byte(sid("a")+":"+wirext.ContactHash), ack.Grant, ack.Token)
	if _, ok := f.att.gate.Authorize("cons", notif, []int{0}); ok {
		t.Fatal("a READ of blocks under a contact grant was served")
	}
	h, ok := f.att.gate.Authorize("cons", notif, nil)
	if !ok {
		t.Fatal("the contact READ was refused")
	}
	h.Release()
	f.InjectNotif("cons", notif)
	po.poll(t, at(time.Millisecond))
	if po.p.Grants() != 0 || po.p.Stats().Completions != 1 || po.pins("R") != 0 {
		t.Fatalf("after its notification: grants %d, stats %+v", po.p.Grants(), po.p.Stats())
	}
	// Its session is known: a fetch is granted and offered for a push.
	f.take()
	po.poll(t, at(2*time.Millisecond), goReq("R", sid("a"), 4))
	if ev := f.take(); len(ev) != 2 || !strings.HasPrefix(ev[1], "push ") {
		t.Fatalf("events %q", ev)
	}
}

// drivenFake is a data plane that must be driven (plane.Driven): it
// records what each Poll reports.
type drivenFake struct {
	*xfake.Fake
	calls []string
}

func (f *drivenFake) ExpectReads(grants int, fresh bool) {
	f.calls = append(f.calls, fmt.Sprintf("%d %v", grants, fresh))
}

func (f *drivenFake) take() []string { c := f.calls; f.calls = nil; return c }

// A driven data plane hears of every grant as it is made, also one that
// replaces a grant ending in the same Poll, when the count of live grants
// does not rise: a READ may come soon, and the data plane drives itself
// closely for it. A Poll that grants nothing says so.
func TestDrivenPlaneHearsOfEveryGrant(t *testing.T) {
	po := &producerOnly{cache: cache.NewEmbeddingCache(16), out: &queue{}}
	for _, k := range []string{"R", "S"} {
		po.cache.Alloc(k, 2)
		po.cache.MarkReady(k)
	}
	f := &drivenFake{Fake: xfake.New("prod", 16, 8)}
	po.data = f.Fake
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet}, f, po.cache, compat))
	defer po.p.Close()
	check := func(what string, want ...string) {
		t.Helper()
		if got := f.take(); !slices.Equal(got, want) {
			t.Fatalf("%s: %q, want %q", what, got, want)
		}
	}
	g := po.poll(t, t0, req("R", sid("a")))[0].Grant
	check("a grant", "1 true")
	po.poll(t, at(time.Millisecond))
	check("nothing new", "1 false")
	// R's notification and a request for S in one Poll: one grant ends,
	// one is made.
	f.InjectNotif("", fmt.Appendf(nil, "%s:R#%d", sid("a"), g))
	po.poll(t, at(2*time.Millisecond), req("S", sid("a")))
	check("a grant replacing one", "1 true")
	po.poll(t, at(3*time.Millisecond), req("missing", sid("a")))
	check("a NACK", "1 false")
}
