package fsm_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/fsm"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

var t0 = time.Unix(1_700_000_000, 0)

type rig struct {
	cfg   xfer.Config
	cons  *xfake.Fake
	prod  *xfake.Fake
	peer  xfer.Peer
	x     *fsm.ConsumerXfer
	ackAt time.Time
}

// newRig returns a transfer of mm_hash "H" into local blocks 10 and 11,
// waiting for its ack until t0+2s, from a producer of 64 blocks.
func newRig(t *testing.T) *rig {
	t.Helper()
	fab := xfake.NewFabric()
	r := &rig{cfg: xfer.Config{}.WithDefaults(), cons: fab.New("consumer", 32, 8), prod: fab.New("producer", 64, 8)}
	var err error
	r.peer, err = r.cons.AddRemotePeer(r.prod.AgentMetadata(), r.prod.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	r.x = fsm.NewConsumerXfer("H", []int{10, 11}, "S", t0, t0.Add(2*time.Second), r.cons, &r.cfg)
	return r
}

// okAck returns the source blocks of an OK ack.
func okAck(ids ...int64) []wire.Int {
	var src []wire.Int
	for _, id := range ids {
		src = append(src, wire.IntOf(id))
	}
	return src
}

// read posts the READ with the given scripted outcome at t0+1s.
func (r *rig) read(t *testing.T, o xfake.Outcome) xfer.Handle {
	t.Helper()
	r.cons.QueueOutcomes(o)
	r.ackAt = t0.Add(time.Second)
	if err := r.x.HandleAck(okAck(5, 6), r.peer, r.ackAt); err != nil {
		t.Fatal(err)
	}
	return r.cons.Posts()[0].Handle
}

func (r *rig) expect(t *testing.T, now time.Time, want fsm.State) {
	t.Helper()
	if got := r.x.Poll(now); got != want {
		t.Fatalf("Poll(t0+%v) = %s (reason %s), want %s", now.Sub(t0), got, r.x.Reason(), want)
	}
}

func TestStateNames(t *testing.T) { // the reference's state names
	want := []string{"waiting_ack", "reading", "done", "ack_timeout", "read_failed", "quarantined", "settled"}
	for i, w := range want {
		if s := fsm.State(i); s.String() != w {
			t.Errorf("State(%d) = %q, want %q", i, s, w)
		}
	}
	if fsm.State(99).String() == "" || xfer.Reason(99).String() == "" || xfer.Progress(9).String() == "" {
		t.Error("unnamed values print empty")
	}
}

func TestWaitingAck(t *testing.T) { // waiting until the ack deadline, then ack-timeout
	r := newRig(t)
	r.expect(t, t0, fsm.WaitingAck)
	r.expect(t, t0.Add(2*time.Second), fsm.WaitingAck) // strictly after
	r.expect(t, t0.Add(2*time.Second+1), fsm.AckTimeout)
	if r.x.Reason() != xfer.AckTimedOut || r.x.HasHandle() {
		t.Fatalf("reason %s, handle %v", r.x.Reason(), r.x.HasHandle())
	}
}

func TestHandleAckPostsRead(t *testing.T) { // posts the READ: notification "S:H", ids in order, READ deadline
	r := newRig(t)
	if err := r.x.HandleAck(okAck(5, 6), r.peer, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	posts := r.cons.Posts()
	if len(posts) != 1 {
		t.Fatalf("%d posts", len(posts))
	}
	p := posts[0]
	if !slices.Equal(p.Local, []int{10, 11}) || !slices.Equal(p.Remote, []int{5, 6}) || p.Agent != "producer" || p.Notif != "S:H" {
		t.Fatalf("post %+v", p)
	}
	if r.x.State() != fsm.Reading || !r.x.HasHandle() {
		t.Fatalf("state %s", r.x.State())
	}
	if want := t0.Add(time.Second + r.cfg.ReadTimeout); !r.x.Deadline().Equal(want) {
		t.Fatalf("deadline %v, want %v", r.x.Deadline(), want)
	}
	// A second ack is refused: the READ is already posted.
	if err := r.x.HandleAck(okAck(5, 6), r.peer, t0); !errors.Is(err, fsm.ErrNotWaiting) {
		t.Fatalf("second ack: %v", err)
	}
}

// The ack is checked before any READ is posted (the first of the session
// package doc's differences from the reference).
func TestHandleAckRefusesBadAcks(t *testing.T) {
	tests := []struct {
		name string
		ack  []wire.Int
	}{
		{"too few source blocks", okAck(5)},
		{"too many source blocks", okAck(5, 6, 7)},
		{"no source blocks", okAck()},
		{"negative id", okAck(5, -1)},
		{"id past the region", okAck(5, 64)},
		{"repeated id", okAck(7, 7)},
		{"id above int64", []wire.Int{wire.IntOf(1), wire.UintOf(1 << 63)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// HandleAckView, from the ack's bytes, refuses it as HandleAck
			// does, with the same words.
			v := newRig(t)
			var view wireview.Ack
			if err := wireview.DecodeAck(wire.AppendAck(nil, &wire.XferAck{MMHash: "H", Status: wire.OK, SrcBlockIndices: tt.ack}), &view); err != nil {
				t.Fatal(err)
			}
			errView := v.x.HandleAckView(&view, v.peer, t0)
			if len(v.cons.Posts()) != 0 || v.x.State() != fsm.ReadFailed || v.x.Reason() != xfer.BadAck {
				t.Fatalf("view: a READ was posted, or state %s reason %s", v.x.State(), v.x.Reason())
			}
			r := newRig(t)
			err := r.x.HandleAck(tt.ack, r.peer, t0)
			if fmt.Sprint(errView) != fmt.Sprint(err) {
				t.Fatalf("view: %v; ids: %v", errView, err)
			}
			if tt.name == "repeated id" {
				// A producer claiming a huge region: the check sorts
				// instead of allocating a bitmap of it.
				huge := r.peer
				huge.Blocks = 1 << 40
				if err := newRig(t).x.HandleAck(tt.ack, huge, t0); !errors.Is(err, fsm.ErrBadAck) {
					t.Fatalf("huge region: err %v, want ErrBadAck", err)
				}
			}
			if !errors.Is(err, fsm.ErrBadAck) {
				t.Fatalf("err %v, want ErrBadAck", err)
			}
			if len(r.cons.Posts()) != 0 || r.x.HasHandle() {
				t.Fatal("a READ was posted")
			}
			if r.x.State() != fsm.ReadFailed || r.x.Reason() != xfer.BadAck {
				t.Fatalf("state %s reason %s", r.x.State(), r.x.Reason())
			}
		})
	}
	// Repeated out of order (the bitmap), and in order around it.
	for _, ids := range [][]int64{{7, 5, 7}, {9, 9, 3}} {
		r := newRig(t)
		r.x = fsm.NewConsumerXfer("H", []int{10, 11, 12}, "S", t0, t0.Add(2*time.Second), r.cons, &r.cfg)
		var view wireview.Ack
		if err := wireview.DecodeAck(wire.AppendAck(nil, &wire.XferAck{MMHash: "H", Status: wire.OK, SrcBlockIndices: okAck(ids...)}), &view); err != nil {
			t.Fatal(err)
		}
		if err := r.x.HandleAckView(&view, r.peer, t0); !errors.Is(err, fsm.ErrBadAck) || len(r.cons.Posts()) != 0 {
			t.Fatalf("%v: err %v, %d posts", ids, err, len(r.cons.Posts()))
		}
	}
	t.Run("post fails", func(t *testing.T) {
		r := newRig(t)
		r.cons.SetPostError(xfake.ErrInjected)
		if err := r.x.HandleAck(okAck(5, 6), r.peer, t0); !errors.Is(err, xfake.ErrInjected) {
			t.Fatalf("err %v", err)
		}
		if r.x.State() != fsm.ReadFailed || r.x.Reason() != xfer.PostFailed || r.x.HasHandle() {
			t.Fatalf("state %s reason %s", r.x.State(), r.x.Reason())
		}
	})
}

func TestReading(t *testing.T) {
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tests := []struct {
		name     string
		out      xfake.Outcome
		polls    []time.Time // the last one gives the final state
		want     fsm.State
		reason   xfer.Reason
		released int // release calls at the end
		handle   bool
	}{
		{"in progress before deadline", xfake.Outcome{Kind: xfake.Stuck}, []time.Time{sec(2), sec(20)}, fsm.Reading, 0, 0, true},
		{"complete", xfake.Outcome{After: 1}, []time.Time{sec(2), sec(3)}, fsm.Done, 0, 1, false},
		{"complete after the read deadline, unseen late", xfake.Outcome{}, []time.Time{sec(25)}, fsm.Done, 0, 1, false},
		{"failed", xfake.Outcome{Kind: xfake.FailAfter}, []time.Time{sec(2)}, fsm.ReadFailed, xfer.ReadError, 1, false},
		{"check fails: quarantine, not freed", xfake.Outcome{Kind: xfake.CheckError}, []time.Time{sec(2)}, fsm.Quarantined, xfer.CheckFailed, 0, true},
		{"in progress past the deadline", xfake.Outcome{Kind: xfake.Stuck}, []time.Time{sec(21.5)}, fsm.Quarantined, xfer.ReadTimedOut, 0, true},
		{"done after the lease", xfake.Outcome{}, []time.Time{sec(31.5)}, fsm.ReadFailed, xfer.LateCompletion, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			h := r.read(t, tt.out)
			var got fsm.State
			for _, now := range tt.polls {
				got = r.x.Poll(now)
			}
			if got != tt.want || r.x.Reason() != tt.reason {
				t.Fatalf("state %s reason %s, want %s %s", got, r.x.Reason(), tt.want, tt.reason)
			}
			if n := r.cons.Releases(h); n != tt.released {
				t.Fatalf("released %d times, want %d", n, tt.released)
			}
			if r.x.HasHandle() != tt.handle {
				t.Fatalf("handle held: %v", r.x.HasHandle())
			}
			if got == fsm.Quarantined {
				if want := tt.polls[len(tt.polls)-1].Add(r.cfg.QuarantineTimeout); !r.x.Deadline().Equal(want) {
					t.Fatalf("quarantine deadline %v, want %v", r.x.Deadline(), want)
				}
			}
		})
	}
}

func TestQuarantine(t *testing.T) {
	// Quarantined at t0+22s by the read timeout; its deadline is t0+82s.
	quarantined := func(t *testing.T, o xfake.Outcome) (*rig, xfer.Handle) {
		r := newRig(t)
		h := r.read(t, o)
		r.expect(t, t0.Add(22*time.Second), fsm.Quarantined)
		return r, h
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

	t.Run("still running within the deadline", func(t *testing.T) {
		r, h := quarantined(t, xfake.Outcome{Kind: xfake.Stuck})
		r.expect(t, at(82), fsm.Quarantined)
		if r.cons.Releases(h) != 0 || !r.x.HasHandle() {
			t.Fatal("released while running")
		}
	})
	t.Run("ends: settled, released once", func(t *testing.T) {
		r, h := quarantined(t, xfake.Outcome{Kind: xfake.Stuck})
		r.cons.Finish(h)
		r.expect(t, at(30), fsm.Settled)
		if r.cons.Releases(h) != 1 || r.x.HasHandle() || r.x.Forced() {
			t.Fatalf("releases %d forced %v", r.cons.Releases(h), r.x.Forced())
		}
		r.expect(t, at(31), fsm.Settled) // terminal
		if r.cons.Releases(h) != 1 {
			t.Fatal("released twice")
		}
	})
	t.Run("fails: settled", func(t *testing.T) {
		r, h := quarantined(t, xfake.Outcome{Kind: xfake.Stuck})
		r.cons.FailRead(h)
		r.expect(t, at(30), fsm.Settled)
	})
	t.Run("check fails: stays quarantined (the reference settles)", func(t *testing.T) {
		r, h := quarantined(t, xfake.Outcome{Kind: xfake.CheckError, After: 1})
		r.expect(t, at(50), fsm.Quarantined)
		if r.cons.Releases(h) != 0 {
			t.Fatal("released while unknown")
		}
		r.cons.Finish(h)
		r.expect(t, at(51), fsm.Settled)
	})
	t.Run("ends after the deadline: settled by the data plane, not forced", func(t *testing.T) {
		r, h := quarantined(t, xfake.Outcome{Kind: xfake.Stuck})
		r.cons.Finish(h)
		r.expect(t, at(100), fsm.Settled)
		if r.x.Forced() || r.x.Reason() != xfer.ReadTimedOut {
			t.Fatalf("forced %v reason %s", r.x.Forced(), r.x.Reason())
		}
	})
	t.Run("deadline passes, release stops it", func(t *testing.T) {
		r, h := quarantined(t, xfake.Outcome{Kind: xfake.Stuck})
		r.expect(t, at(83), fsm.Settled)
		if r.cons.Releases(h) != 1 || r.x.Forced() || r.x.Reason() != xfer.QuarantineTimedOut {
			t.Fatalf("releases %d forced %v reason %s", r.cons.Releases(h), r.x.Forced(), r.x.Reason())
		}
	})
	t.Run("deadline passes, release cannot stop it: forced", func(t *testing.T) {
		r, h := quarantined(t, xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
		r.expect(t, at(83), fsm.Settled)
		if r.cons.Releases(h) != 1 || !r.x.Forced() {
			t.Fatalf("releases %d forced %v", r.cons.Releases(h), r.x.Forced())
		}
		if !r.cons.MayWrite(10) {
			t.Fatal("the fake forgot the unstoppable READ")
		}
	})
}

func TestCancelReleasePeerDown(t *testing.T) {
	t.Run("cancel waiting", func(t *testing.T) {
		r := newRig(t)
		if err := r.x.Cancel(); err != nil || r.x.State() != fsm.AckTimeout || r.x.Reason() != xfer.Closed {
			t.Fatalf("err %v state %s", err, r.x.State())
		}
	})
	t.Run("cancel reading refused", func(t *testing.T) {
		r := newRig(t)
		r.read(t, xfake.Outcome{Kind: xfake.Stuck})
		if err := r.x.Cancel(); !errors.Is(err, fsm.ErrNotWaiting) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("release reading", func(t *testing.T) {
		r := newRig(t)
		h := r.read(t, xfake.Outcome{Kind: xfake.Stuck})
		if err := r.x.Release(); err != nil || r.cons.Releases(h) != 1 || r.x.HasHandle() {
			t.Fatalf("err %v releases %d", err, r.cons.Releases(h))
		}
		if err := r.x.Release(); err != nil || r.cons.Releases(h) != 1 { // released once
			t.Fatalf("second release: %v, %d", err, r.cons.Releases(h))
		}
	})
	t.Run("release unstoppable", func(t *testing.T) {
		r := newRig(t)
		r.read(t, xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
		if err := r.x.Release(); !errors.Is(err, xfer.ErrMayStillWrite) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("release without handle", func(t *testing.T) {
		r := newRig(t)
		if err := r.x.Release(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("peer down waiting", func(t *testing.T) {
		r := newRig(t)
		if s := r.x.PeerDown(t0); s != fsm.AckTimeout || r.x.Reason() != xfer.PeerDown {
			t.Fatalf("state %s reason %s", s, r.x.Reason())
		}
	})
	t.Run("peer down reading", func(t *testing.T) {
		// The READ runs on, on its data connection, to its own end.
		r := newRig(t)
		h := r.read(t, xfake.Outcome{Kind: xfake.Stuck})
		if s := r.x.PeerDown(t0.Add(5 * time.Second)); s != fsm.Reading || r.x.Reason() != xfer.NoReason {
			t.Fatalf("state %s reason %s", s, r.x.Reason())
		}
		if !r.x.Deadline().Equal(r.ackAt.Add(r.cfg.ReadTimeout)) || r.cons.Releases(h) != 0 {
			t.Fatalf("deadline %v", r.x.Deadline())
		}
		r.cons.Finish(h)
		r.expect(t, t0.Add(6*time.Second), fsm.Done)
	})
}

func TestReset(t *testing.T) {
	r := newRig(t)
	r.read(t, xfake.Outcome{})
	r.expect(t, t0.Add(2*time.Second), fsm.Done)
	r.x.Reset("G", []int{1}, "S2", t0, t0.Add(time.Second), r.cons, &r.cfg)
	if r.x.State() != fsm.WaitingAck || string(r.x.Notif()) != "S2:G" || r.x.Reason() != xfer.NoReason || r.x.HasHandle() {
		t.Fatalf("after reset: %s %q %s", r.x.State(), r.x.Notif(), r.x.Reason())
	}
}

func TestProducerXferExpired(t *testing.T) { // expired strictly after the deadline
	p := fsm.ProducerXfer{Deadline: t0}
	if p.Expired(t0.Add(-time.Second)) || p.Expired(t0) || !p.Expired(t0.Add(1)) {
		t.Fatal("expiry is not strictly after the deadline")
	}
}

func TestConfigDefaults(t *testing.T) {
	c := xfer.Config{ReadTimeout: time.Second}.WithDefaults()
	d := xfer.Config{}.WithDefaults()
	if c.ReadTimeout != time.Second || c.QuarantineTimeout != d.QuarantineTimeout || c.PinLease != 30*time.Second || d.ReadTimeout != 20*time.Second || d.QuarantineTimeout != 60*time.Second {
		t.Fatalf("%+v / %+v", c, d)
	}
}

// The producer's lease started when it granted, between our request and its
// ack: a READ first seen done after request time + lease is not trusted,
// even when ack time + lease has not passed yet.
func TestLateCompletionCountsFromTheRequest(t *testing.T) {
	r := newRig(t) // request sent at t0
	r.cons.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck})
	if err := r.x.HandleAck(okAck(5, 6), r.peer, t0.Add(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	r.cons.Finish(r.cons.Posts()[0].Handle)
	r.expect(t, t0.Add(31*time.Second), fsm.ReadFailed) // < ack + 30 s, > request + 30 s
	if r.x.Reason() != xfer.LateCompletion {
		t.Fatalf("reason %s", r.x.Reason())
	}
}

// An OK ack handled after the lease posts no READ: the transfer ends with
// a retry allowed. At the lease's end exactly it still posts. The lease is
// the one the ack advertises, else the configured one, counted from the
// request.
func TestAckPastTheLeasePostsNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease time.Duration // advertised; zero: none
		end   time.Duration // from t0, the request's send time
	}{
		{"configured", 0, 30 * time.Second},
		{"advertised", 5 * time.Second, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, late := range []bool{false, true} {
				r := newRig(t)
				r.x.Grant(0, wire.Token{}, tc.lease)
				if got := r.x.LeaseEnd(); !got.Equal(t0.Add(tc.end)) || !r.x.SentAt().Equal(t0) {
					t.Fatalf("lease end +%v, sent +%v", got.Sub(t0), r.x.SentAt().Sub(t0))
				}
				now := t0.Add(tc.end)
				if late {
					now = now.Add(time.Nanosecond)
				}
				err := r.x.HandleAck(okAck(5, 6), r.peer, now)
				switch {
				case !late && (err != nil || r.x.State() != fsm.Reading):
					t.Fatalf("at the lease's end: %v, %s", err, r.x.State())
				case late && (!errors.Is(err, fsm.ErrLeaseOver) || r.x.State() != fsm.AckTimeout || r.x.Reason() != xfer.LateCompletion):
					t.Fatalf("past the lease: %v, %s %s", err, r.x.State(), r.x.Reason())
				case late && (len(r.cons.Posts()) != 0 || r.x.HasHandle()):
					t.Fatal("a READ was posted past the lease")
				}
			}
		})
	}
	// CheckLease alone acts only on a transfer waiting for its ack.
	r := newRig(t)
	r.read(t, xfake.Outcome{Kind: xfake.Stuck})
	if err := r.x.CheckLease(t0.Add(time.Hour)); err != nil || r.x.State() != fsm.Reading {
		t.Fatalf("reading: %v, %s", err, r.x.State())
	}
}

// A READ a Release could not stop stays one that may write: a later
// Release says so, and its quarantine ends forced, never as confirmed.
func TestUnstoppedReadStaysUnsafe(t *testing.T) {
	r := newRig(t)
	r.read(t, xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	if err := r.x.Release(); !errors.Is(err, xfer.ErrMayStillWrite) {
		t.Fatalf("first Release: %v", err)
	}
	if err := r.x.Quarantine(r.ackAt, xfer.Canceled); err != nil {
		t.Fatal(err)
	}
	if err := r.x.Release(); !errors.Is(err, xfer.ErrMayStillWrite) {
		t.Fatalf("a second Release called the READ stopped: %v", err)
	}
	r.expect(t, r.ackAt.Add(time.Second), fsm.Quarantined)
	r.expect(t, r.ackAt.Add(r.cfg.QuarantineTimeout+time.Second), fsm.Settled)
	if !r.x.Forced() {
		t.Fatal("settled as confirmed, though nothing confirmed the READ ended")
	}
}
