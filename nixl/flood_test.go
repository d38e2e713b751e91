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
// a's step loop drains them and calls grant (if not nil) every 50 ms, and
// fails the test if a's progress goroutine spends more than 5 % of a
// second in rounds it does not pause after (1 % without grants, when no
// notification may count).
func floodSpinsLittle(t *testing.T, a *Agent, grant func()) {
	t.Helper()
	f, _ := newAgent(t, variants[0], 8, 64, Config{SyncPost: true, Progress: ProgressCaller})
	fp, err := f.AddRemotePeer(a.AgentMetadata(), a.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int64 // notifications a's step loop drained
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { // the peer: notifications as fast as it can
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			f.connect(ctx, fp.Agent, fmt.Appendf(nil, "flood:%d", i), wire.Blocks{})
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
	s0, w0, n0 := a.spun.Load(), a.wakeups.Load(), seen.Load()
	time.Sleep(window)
	spun, woke, n := time.Duration(a.spun.Load()-s0), a.wakeups.Load()-w0, seen.Load()-n0
	// Each grant's notification may start a spin (Spin, 50 µs): 20 grants
	// a second. 5 % of the window allows for a loaded machine (progress
	// calls it slows past movedCall start spins too).
	most := window / 20
	if grant == nil {
		most = window / 100
	}
	if spun > most {
		t.Fatalf("under a flood of notifications the progress goroutine spun %v in %v (%d wake-ups)", spun, window, woke)
	}
	t.Logf("under a flood of %d notifications: spun %v in %v, %d wake-ups", n, spun, window, woke)
}
