package session

import (
	"errors"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A contact answer that does not decode (a status this consumer does not
// know) ends the contact with the decode error, as the same reply to a
// fetch's request does.
func TestContactAnswerNamesItsDecodeError(t *testing.T) {
	co := newConsumer(t)
	if err := co.c.sendContact(at(time.Second), t0); err != nil {
		t.Fatal(err)
	}
	odd, _ := msgpack.Marshal(map[string]any{"type": "ack", "mm_hash": wirext.ContactHash, "status": 9,
		"session_id": co.c.id, "ecx_attempt": co.lastAttempt(t)})
	co.poll(at(time.Millisecond), odd)
	done, _, err := co.c.contacted()
	if !done {
		t.Fatal("contact not done")
	}
	if !errors.Is(err, wire.ErrInvalid) {
		t.Errorf("contact's error %q does not name the decode error (wire.ErrInvalid)", err)
	}
}

// Close of a READ that cannot be stopped records a BlocksHeld failure and
// a Forced release, both carrying the Release's error.
func TestCloseOfAnUnstoppableReadNamesWhy(t *testing.T) {
	co := newConsumer(t)
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	mustStart(t, co.c, "H", []int{1}, at(40*time.Second))
	co.poll(at(time.Millisecond), co.ok("H", 1))
	if len(co.data.Posts()) != 1 {
		t.Fatal("no READ posted")
	}
	co.c.Close()
	var r Results
	co.c.TakeResults(&r)
	if len(r.Failed) != 1 || !r.Failed[0].BlocksHeld || r.Failed[0].Reason != xfer.Closed {
		t.Fatalf("results %+v", r)
	}
	if !errors.Is(r.Failed[0].Err, xfer.ErrMayStillWrite) {
		t.Errorf("held failure's Err %v does not name the Release error (xfer.ErrMayStillWrite)", r.Failed[0].Err)
	}
	if len(r.Released) != 1 || !r.Released[0].Forced || !errors.Is(r.Released[0].Err, xfer.ErrMayStillWrite) {
		t.Errorf("released %+v, want one Forced naming xfer.ErrMayStillWrite", r.Released)
	}
}

// A READ released at the quarantine deadline without being seen ended
// (Forced) says why: the data plane's Release error, and its last Check's
// where that failed.
func TestForcedReleaseNamesWhy(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  xfake.Outcome
		also error // the last Check's, beside xfer.ErrMayStillWrite
	}{
		{"release refused", xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true}, nil},
		{"check failing", xfake.Outcome{Kind: xfake.CheckError, Unstoppable: true}, xfake.ErrInjected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := newConsumer(t)
			co.data.SetOutcome(tc.out)
			mustStart(t, co.c, "H", []int{1}, at(time.Second))
			co.poll(at(time.Millisecond), co.ok("H", 1))
			r := co.untilReleased()
			if len(r.Released) != 1 || !r.Released[0].Forced {
				t.Fatalf("released %+v, want one Forced", r.Released)
			}
			if err := r.Released[0].Err; !errors.Is(err, xfer.ErrMayStillWrite) || tc.also != nil && !errors.Is(err, tc.also) {
				t.Fatalf("forced release's Err %v, want one naming xfer.ErrMayStillWrite and %v", err, tc.also)
			}
		})
	}
}
