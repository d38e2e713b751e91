package connector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A fetch whose retry budget is spent fails with its last attempt's
// reason, and names what its earlier attempt met: attempt 1's ack timed
// out (its request lost), attempt 2 met NACK_NOT_READY with no budget
// left (MaxAttempts 2).
func TestBudgetSpentNamesTheEarlierAttempt(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 5 * time.Millisecond,
		Retry: RetryConfig{MaxAttempts: 2, BaseBackoff: time.Millisecond, MaxBackoff: time.Millisecond}})
	w.entry(t, "H", 2, false) // NACK_NOT_READY
	w.fetch(t, "H", time.Minute)
	delete(w.ctl.out, addr)          // attempt 1's request is lost
	w.stepOnly(6 * time.Millisecond) // ack timeout: retry planned
	r := w.until(t, time.Millisecond, 20, func(r Results) bool { return len(r.Failed) > 0 })
	h := pick(r.Failed, "H")
	if len(h) != 1 {
		t.Fatalf("H: %+v", r)
	}
	checkNames(t, h[0], xfer.Nacked, wire.NackNotReady)
	if !errors.Is(h[0].Err, xfer.AckTimedOut) {
		t.Errorf("Err does not name the earlier attempt's ack timeout")
	}
}

// One attempt only (MaxAttempts 1): there is no earlier attempt to name.
func TestSingleAttemptNamesNoEarlierAttempt(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{MaxAttempts: 1}})
	w.entry(t, "H", 2, false) // NACK_NOT_READY
	w.fetch(t, "H", time.Minute)
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Failed) > 0 })
	h := pick(r.Failed, "H")
	if len(h) != 1 {
		t.Fatalf("H: %+v", r)
	}
	if strings.Contains(h[0].Err.Error(), "earlier attempt") {
		t.Errorf("one attempt made, yet Err names an earlier one")
	}
}

// scriptCtl: the first contact's connection dies; the second is answered
// NACK_NOT_READY (busy); the later ones are never answered.
type scriptCtl struct {
	*memCtl
	n int
}

func (s *scriptCtl) Send(a string, p []byte) error {
	s.n++
	switch s.n {
	case 1:
		s.dead = append(s.dead, xfer.Death{Addr: a, Err: errClosed})
	case 2:
		var r wire.XferReq
		if err := wire.DecodeReq(p, &r); err != nil {
			panic(err)
		}
		ack := wire.XferAck{MMHash: wirext.ContactHash, Status: wire.NackNotReady, SessionID: r.SessionID, Attempt: r.Attempt}
		s.in = append(s.in, xfer.Inbound{Addr: a, Payload: wire.AppendAck(nil, &ack)})
	}
	return nil
}

// Connect ended by its context names what its latest ended try met: here
// a busy producer, after an earlier try's connection died.
func TestConnectNamesItsLatestTry(t *testing.T) {
	w := newWorld(t, PoolConfig{AckTimeout: 10 * time.Second})
	sc := &scriptCtl{memCtl: w.ctl}
	w.pool.ctl = sc
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := w.pool.Connect(ctx, addr)
	if sc.n < 3 {
		t.Fatalf("the script did not run: %d sends", sc.n)
	}
	if err == nil || errors.Is(err, errClosed) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), wire.NackNotReady.Error()) || strings.Contains(err.Error(), errClosed.Error()) {
		t.Errorf("Connect's error %q, want ctx's, naming the later try's NACK_NOT_READY, not the earlier death", err)
	}
}

// oddContactCtl answers every contact with a status no one knows.
type oddContactCtl struct{ *memCtl }

func (s *oddContactCtl) Send(a string, p []byte) error {
	var r wire.XferReq
	if err := wire.DecodeReq(p, &r); err != nil {
		panic(err)
	}
	ack := wire.XferAck{MMHash: wirext.ContactHash, Status: wire.Status(9), SessionID: r.SessionID, Attempt: r.Attempt}
	s.in = append(s.in, xfer.Inbound{Addr: a, Payload: wire.AppendAck(nil, &ack)})
	return nil
}

// A contact answer that does not decode fails Connect as bad-ack, not as
// a data plane this consumer cannot use.
func TestConnectUndecodableAnswerIsNotAPlaneMismatch(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.pool.ctl = &oddContactCtl{w.ctl}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := w.pool.Connect(ctx, addr)
	if !errors.Is(err, xfer.BadAck) || errors.Is(err, xfer.RegisterFailed) || strings.Contains(err.Error(), planeHint) {
		t.Errorf("an undecodable contact answer: %v", err)
	}
}

// Cancel names the earlier attempt's NACK whether it ends a retry in
// flight or the fetch between attempts.
func TestCancelNamesTheEarlierAttemptEitherWay(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		t.Run(fmt.Sprint("in flight ", inFlight), func(t *testing.T) {
			w := nackThenRetryDue(t, time.Minute)
			if inFlight {
				w.stepOnly(15 * time.Millisecond) // the retry is sent, never answered
			}
			f, err := w.pool.Cancel("H", w.now)
			if err != nil {
				t.Fatal(err)
			}
			checkNames(t, f, xfer.Canceled, wire.NackNotReady)
		})
	}
}

// nackThenRead: H is NACKed (not ready), then its retry's READ is posted
// and never ends (unstoppable): a READ in flight of a second attempt.
func nackThenRead(t *testing.T, budget time.Duration) *world {
	t.Helper()
	w := nackThenRetryDue(t, budget)
	w.cache.MarkReady("H")
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	for i := 0; i < 20 && len(w.cdata.Posts()) == 0; i++ {
		w.step(time.Millisecond)
	}
	if len(w.cdata.Posts()) != 1 {
		t.Fatal("no READ posted")
	}
	return w
}

// What ends a retry's READ in flight (held: it may still write) names the
// earlier attempt's NACK too.
func TestEndOfARetrysReadNamesTheEarlierAttempt(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		w := nackThenRead(t, 100*time.Millisecond)
		var h []Failure
		for i := 0; i < 200 && len(h) == 0; i++ {
			h = pick(w.stepOnly(time.Millisecond).Failed, "H")
		}
		if len(h) != 1 || !h[0].BlocksHeld {
			t.Fatalf("H: %+v", h)
		}
		checkNames(t, h[0], xfer.DeadlineExceeded, wire.NackNotReady)
	})
	t.Run("silence", func(t *testing.T) {
		w := nackThenRead(t, time.Minute)
		w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errSilent})
		h := pick(w.stepOnly(time.Millisecond).Failed, "H")
		if len(h) != 1 || !h[0].BlocksHeld {
			t.Fatalf("H: %+v", h)
		}
		checkNames(t, h[0], xfer.PeerDown, xfer.ErrPeerSilent, wire.NackNotReady)
	})
	t.Run("cancel", func(t *testing.T) {
		w := nackThenRead(t, time.Minute)
		f, err := w.pool.Cancel("H", w.now)
		if err != nil {
			t.Fatal(err)
		}
		if !f.BlocksHeld {
			t.Fatalf("H: %+v", f)
		}
		checkNames(t, f, xfer.Canceled, wire.NackNotReady)
	})
}
