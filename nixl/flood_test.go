//go:build nixl || nixlfake

package nixl

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
)

// What a peer sends never keeps the progress goroutine from parking: a
// peer's notification counts as work (restarting the spin and the pauses)
// at most once per grant made, so that notifications sent as fast as a
// peer can (a hostile or broken agent) cost a spin per grant, not a core.
// Here a producer grants anew every 50 ms, so that its newest grant stays
// young: its only grant, or one of 4,096 live (each step that grants
// replaces one that ended).
func TestPeerNotificationsDoNotKeepUsSpinning(t *testing.T) {
	t.Run("one grant", func(t *testing.T) {
		a, _ := newAgent(t, variants[0], 8, 64, Config{})
		a.expectReads(1)
		defer a.expectReads(0)
		floodSpinsLittle(t, a, func() { a.expectReads(0); a.expectReads(1) })
	})
	t.Run("4096 grants", func(t *testing.T) {
		a, _ := newAgent(t, variants[0], 8, 64, Config{})
		p := agentPlane{a}
		p.ExpectReads(4096, true)
		defer p.ExpectReads(0, false)
		floodSpinsLittle(t, a, func() { p.ExpectReads(4096, true) })
	})
}

// floodSpinsLittle has a peer send notifications as fast as it can, while
// a's step loop drains them and calls grant (if not nil) every 50 ms. It
// fails the test if fewer than 1,000 arrive in a second, if more of them
// count as work in it than grants were made (one more for a grant made
// just before), or if a's progress goroutine spends more than 10 % of it
// in rounds it does not pause after (2 % without grants, when none may
// count; the time includes a loaded machine's preemptions).
func floodSpinsLittle(t *testing.T, a *Agent, grant func()) {
	t.Helper()
	f, _ := newAgent(t, variants[0], 8, 64, Config{SyncPost: true, Progress: ProgressCaller})
	fp, err := f.AddRemotePeer(a.AgentMetadata(), a.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	var seen, grants atomic.Int64 // notifications a's step loop drained; grants it made
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	flood := make(chan error, 1)
	go func() { // the peer: notifications as fast as it can
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			if err := f.connect(ctx, fp.Agent, fmt.Appendf(nil, "flood:%d", i), wire.Blocks{}); err != nil && ctx.Err() == nil {
				flood <- err
				return
			}
			f.DrainNotifs(nil)
		}
	}()
	go func() { // a's step loop
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-a.readyChan():
				got, _ := a.DrainNotifs(nil)
				seen.Add(int64(len(got)))
			case <-tick.C:
				if grant != nil {
					grant()
					grants.Add(1)
				}
			}
		}
	}()
	// The grants made before the window lend the flood one count each
	// (4,096 at first in one case): the window starts once they are spent,
	// so that it sees only the grants made in it.
	time.Sleep(100 * time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); a.credit.Load() > 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if c := a.credit.Load(); c > 1 {
		t.Fatalf("the flood left %d counts of grants unspent in 10 s", c)
	}
	const window = time.Second
	s0, w0, n0, c0, g0 := a.spun.Load(), a.wakeups.Load(), seen.Load(), a.counted.Load(), grants.Load()
	time.Sleep(window)
	spun, woke, n := time.Duration(a.spun.Load()-s0), a.wakeups.Load()-w0, seen.Load()-n0
	counted, granted := a.counted.Load()-c0, grants.Load()-g0
	select {
	case err := <-flood:
		t.Fatalf("the flood: %v", err)
	default:
	}
	if n < 1000 {
		t.Fatalf("only %d notifications arrived in %v: no flood", n, window)
	}
	if counted > uint64(granted)+1 {
		t.Fatalf("%d notifications counted as work in %v, for %d grants", counted, window, granted)
	}
	most := window / 10
	if grant == nil {
		most = window / 50
	}
	if spun > most {
		t.Fatalf("under a flood of notifications the progress goroutine spun %v in %v (%d wake-ups)", spun, window, woke)
	}
	t.Logf("under a flood of %d notifications: %d counted for %d grants, spun %v in %v, %d wake-ups", n, counted, granted, spun, window, woke)
}
