package session

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

// stuckSays is the fake whose Release of a READ it cannot stop says why, as
// nixl/agent.go does ("%w: READ %d still in progress", xfer.ErrMayStillWrite).
type stuckSays struct{ *xfake.Fake }

func (n stuckSays) Release(h xfer.Handle) error {
	if err := n.Fake.Release(h); err != nil {
		if errors.Is(err, xfer.ErrMayStillWrite) {
			return fmt.Errorf("%w: READ %d still in progress", xfer.ErrMayStillWrite, h)
		}
		return err
	}
	return nil
}

// newConsumerOver is newConsumer whose session sees its fake through
// wrap (a data plane that answers some calls its own way).
func newConsumerOver(t *testing.T, wrap func(*xfake.Fake) xfer.DataTransport) *consumerOnly {
	t.Helper()
	fab := xfake.NewFabric()
	co := &consumerOnly{data: fab.New("cons", 64, 16), prod: fab.New("prod", 64, 16), out: &queue{}}
	co.c = must(NewConsumerSession(ConsumerConfig{Logger: quiet}, co.out, wrap(co.data), compat))
	return co
}

// untilReleased polls co once a second of the test's clock, from +2 s,
// until a Step hands out a Released (or 400 s pass), and returns that
// Step's results.
func (co *consumerOnly) untilReleased() Results {
	var r Results
	for i := 2; i < 400 && len(r.Released) == 0; i++ {
		r = co.poll(at(time.Duration(i) * time.Second))
	}
	return r
}

// A READ a Cancel could not stop (stoppable plane, Release refused) is
// quarantined loose; Close then releases it Forced, naming what the data
// plane said.
func TestCloseOfALooseQuarantinedReadNamesThePlane(t *testing.T) {
	co := newConsumerOver(t, func(f *xfake.Fake) xfer.DataTransport { return stuckSays{f} })
	co.data.SetStopsReads(true)
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	mustStart(t, co.c, "H", []int{1}, at(40*time.Second))
	co.poll(at(time.Millisecond), co.ok("H", 1))
	if err := co.c.Cancel("H", at(2*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var r Results
	co.c.TakeResults(&r)
	if len(r.Failed) != 1 || !r.Failed[0].BlocksHeld {
		t.Fatalf("cancel: %+v", r)
	}
	co.c.Close()
	r = Results{}
	co.c.TakeResults(&r)
	if len(r.Released) != 1 || !r.Released[0].Forced || r.Released[0].Err == nil {
		t.Fatalf("close: %+v", r)
	}
	if !strings.Contains(r.Released[0].Err.Error(), "still in progress") {
		t.Errorf("forced release's Err %q drops the data plane's error", r.Released[0].Err)
	}
}

// A data plane's own error that wraps ErrMayStillWrite is not wrapped in
// it again: its text appears once.
func TestMayStillWriteTextOnce(t *testing.T) {
	for _, route := range []string{"close", "quarantine deadline"} {
		t.Run(route, func(t *testing.T) {
			co := newConsumerOver(t, func(f *xfake.Fake) xfer.DataTransport { return stuckSays{f} })
			co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
			mustStart(t, co.c, "H", []int{1}, at(time.Second))
			co.poll(at(time.Millisecond), co.ok("H", 1))
			var r Results
			if route == "close" {
				co.c.Close()
				co.c.TakeResults(&r)
			} else {
				r = co.untilReleased()
			}
			if len(r.Released) != 1 || r.Released[0].Err == nil {
				t.Fatalf("%+v", r)
			}
			s := r.Released[0].Err.Error()
			if n := strings.Count(s, xfer.ErrMayStillWrite.Error()); n > 1 {
				t.Errorf("%q says %q %d times", s, xfer.ErrMayStillWrite, n)
			}
		})
	}
}

var errOldCheck = errors.New("an old check's failure")

// failsTwice fails the second and third Checks; the others are the fake's.
type failsTwice struct {
	*xfake.Fake
	n *int
}

func (o failsTwice) Check(h xfer.Handle) (xfer.Progress, error) {
	*o.n++
	if *o.n == 2 || *o.n == 3 { // the second quarantines it; the third is the first in quarantine
		return 0, errOldCheck
	}
	return o.Fake.Check(h)
}

// A forced release names the last Check's error only if the last Check
// failed: one that failed long ago, followed by many that could only say
// in progress, is not "its last check".
func TestForcedReleaseNamesNoStaleCheck(t *testing.T) {
	n := 0
	co := newConsumerOver(t, func(f *xfake.Fake) xfer.DataTransport { return failsTwice{f, &n} })
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	mustStart(t, co.c, "H", []int{1}, at(time.Second))
	co.poll(at(time.Millisecond), co.ok("H", 1))
	r := co.untilReleased()
	if len(r.Released) != 1 || !r.Released[0].Forced || r.Released[0].Err == nil || n < 5 {
		t.Fatalf("%d checks, %+v", n, r)
	}
	if errors.Is(r.Released[0].Err, errOldCheck) {
		t.Errorf("Released.Err %q names an old check, though %d later ones said in progress", r.Released[0].Err, n-3)
	}
}
