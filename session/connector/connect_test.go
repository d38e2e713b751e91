package connector

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/hooks"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// loopCtl is memCtl whose sends reach the producer at once, its replies
// queued for the Pool's next Drain: a Pool's own waits (Connect's) see
// them without a step of the test's.
type loopCtl struct {
	*memCtl
	w     *world
	strip bool // the producer reads none of the extensions and writes none
}

func (l *loopCtl) Send(a string, p []byte) error {
	if l.strip {
		var r wire.XferReq
		wire.DecodeReq(p, &r)
		p = wire.AppendReq(nil, &wire.XferReq{MMHash: r.MMHash, CompatibilityHash: r.CompatibilityHash, SessionID: r.SessionID})
	}
	n := len(l.in)
	l.w.prod.Poll([]xfer.Message{{Identity: []byte("c"), Payload: p}}, replier{l.memCtl, a}, l.w.now)
	if l.strip {
		for i := n; i < len(l.in); i++ {
			var ack wire.XferAck
			wire.DecodeAck(l.in[i].Payload, &ack)
			ack.Attempt, ack.Grant, ack.Token, ack.LeaseMillis = 0, 0, wire.Token{}, 0
			l.in[i].Payload = wire.AppendAck(nil, &ack)
		}
	}
	return nil
}

func newLoopWorld(t *testing.T, strip bool) *world {
	t.Helper()
	w := newWorld(t, PoolConfig{})
	lc := &loopCtl{memCtl: w.ctl, w: w, strip: strip}
	w.pool.ctl = lc
	return w
}

// Connect registers the producer from its answer to a contact request
// before any fetch; the fetches after it say so (ecx_known), and the
// producer describes its region once, in that answer.
func TestConnectRegistersBeforeTheFirstFetch(t *testing.T) {
	w := newLoopWorld(t, false)
	w.entry(t, "H", 2, true)
	if err := w.pool.Connect(context.Background(), addr); err != nil {
		t.Fatal(err)
	}
	pe := w.pool.peers[addr]
	if _, ok := hooks.ConsumerOf(pe.s).Registered(); !ok {
		t.Fatal("not registered after Connect")
	}
	if st := w.prod.Stats(); st.Contacts != 1 || st.Grants != 0 {
		t.Fatalf("producer %+v", st)
	}
	w.pool.Fetch(addr, "H", []int{5, 6}, w.now.Add(time.Minute), w.now)
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 })
	if len(r.Completed) != 1 || len(r.Failed) != 0 {
		t.Fatalf("%+v", r)
	}
	if st := w.prod.Stats(); st.DescsSent+st.ShapesSent != 1 || st.Grants != 1 {
		t.Fatalf("the region was described %d times", st.DescsSent+st.ShapesSent)
	}
	if pe.s.Stats().Registrations != 1 {
		t.Fatalf("%d registrations", pe.s.Stats().Registrations)
	}
}

// A producer that does not read the contact request (vLLM's) answers it
// NACK_MISSING: Connect returns nil, the first fetch registers it. One
// that refuses otherwise fails Connect.
func TestConnectWithoutContact(t *testing.T) {
	w := newLoopWorld(t, true)
	w.entry(t, "H", 1, true)
	if err := w.pool.Connect(context.Background(), addr); err != nil {
		t.Fatal(err)
	}
	if _, ok := hooks.ConsumerOf(w.pool.peers[addr].s).Registered(); ok {
		t.Fatal("registered from a NACK")
	}
	w.pool.Fetch(addr, "H", []int{5}, w.now.Add(time.Minute), w.now)
	if r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 }); len(r.Failed) != 0 {
		t.Fatalf("%+v", r)
	}

	w = newLoopWorld(t, false)
	w.prod = must(session.NewProducerSession(session.ProducerConfig{Logger: quiet}, w.pdata, w.cache, "other"))
	err := w.pool.Connect(context.Background(), addr)
	if !errors.Is(err, ErrContactRefused) {
		t.Fatalf("Connect to an incompatible producer: %v", err)
	}
}

// Connect returns ctx's error when nothing answers in time, naming what
// its last try met.
func TestConnectEndsWithItsContext(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: time.Millisecond})
	// Long beside the ack timeout, so that a loaded machine still asks
	// twice before it ends.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := w.pool.Connect(ctx, addr)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer to the contact request") {
		t.Fatalf("Connect with no producer: %v", err)
	}
	if n := len(w.ctl.out[addr]); n < 2 {
		t.Fatalf("%d contact requests: unanswered ones are asked again", n)
	}
}

// The first wave of fetches to a producer not yet registered: one request
// goes, the others wait for its answer, which registers the producer, and
// then go saying so (ecx_known): the producer describes its region once.
// A NACK for the first answers it as well.
func TestFirstWaveWaitsForTheFirstAnswer(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	hashes := []string{"A", "B", "C", "D", "E", "F", "G", "H"}
	for _, h := range hashes {
		w.entry(t, h, 1, true)
	}
	for i, h := range hashes {
		w.pool.Fetch(addr, h, []int{i}, w.now.Add(time.Minute), w.now)
	}
	if n := len(w.ctl.out[addr]); n != 1 {
		t.Fatalf("%d requests before the producer's first answer, want 1", n)
	}
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) == len(hashes) })
	if len(r.Failed) != 0 {
		t.Fatalf("%+v", r)
	}
	st := w.prod.Stats()
	if st.Requests != uint64(len(hashes)) || st.DescsSent+st.ShapesSent != 1 {
		t.Fatalf("%d requests, the region described %d times", st.Requests, st.DescsSent+st.ShapesSent)
	}
	if ps := w.pool.Stats(); ps.Retries != 0 || ps.AckTimeouts != 0 {
		t.Fatalf("pool %+v", ps)
	}

	// The first answered with a NACK: the rest go at once, held no more.
	w = newWorld(t, PoolConfig{})
	w.entry(t, "B", 1, true)
	w.pool.Fetch(addr, "absent", []int{0}, w.now.Add(time.Minute), w.now)
	w.pool.Fetch(addr, "B", []int{1}, w.now.Add(time.Minute), w.now)
	if n := len(w.ctl.out[addr]); n != 1 {
		t.Fatalf("%d requests before the first answer", n)
	}
	r = w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed)+len(r.Failed) == 2 })
	if len(r.Completed) != 1 || r.Failed[0].Status != wire.NackMissing {
		t.Fatalf("%+v", r)
	}
}

// A fetch held for the first answer is canceled as any between attempts,
// and goes after an ack timeout if no answer comes.
func TestHeldFetchCancelAndBound(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 100 * time.Millisecond})
	w.pool.Fetch(addr, "A", []int{0}, w.now.Add(time.Minute), w.now)
	w.pool.Fetch(addr, "B", []int{1}, w.now.Add(time.Minute), w.now)
	w.pool.Fetch(addr, "C", []int{2}, w.now.Add(time.Minute), w.now)
	if f, err := w.pool.Cancel("B", w.now); err != nil || f.BlocksHeld || f.Reason.String() != "canceled" {
		t.Fatalf("cancel of a held fetch: %+v, %v", f, err)
	}
	delete(w.ctl.out, addr) // the first request is lost
	w.pool.Step(w.now.Add(50 * time.Millisecond))
	if len(w.ctl.out[addr]) != 0 {
		t.Fatal("a held fetch went before its bound")
	}
	w.pool.Step(w.now.Add(100 * time.Millisecond))
	if got := len(w.ctl.out[addr]); got != 1 {
		t.Fatalf("%d requests at the bound, want C's", got)
	}
	if w.pool.fetches["C"] == nil || w.pool.fetches["B"] != nil {
		t.Fatal("C is not in flight, or B is")
	}
}
