//go:build nixl || nixlfake

package nixl

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
)

// What a peer sends never keeps the progress goroutine from parking: a
// peer's notification counts as work (restarting the spin and the pauses)
// at most once per grant live at the newest grant, so that notifications
// sent as fast as a peer can (a hostile or broken agent) cost wake-ups in
// proportion to the grants it was given, not a core. Here a producer's
// grant is renewed every 50 ms, so that it stays young.
func TestPeerNotificationsDoNotKeepUsSpinning(t *testing.T) {
	a, _ := newAgent(t, variants[0], 8, 64, Config{})
	floodSpinsLittle(t, a, true)
}

// floodSpinsLittle has a peer send a notifications as fast as it can, while
// a's step loop drains them (and, if grant, grants anew every 50 ms), and
// fails the test if a's progress goroutine spends more than 5 % of a
// second in rounds it does not pause after.
func floodSpinsLittle(t *testing.T, a *Agent, grant bool) {
	t.Helper()
	f, _ := newAgent(t, variants[0], 8, 64, Config{SyncPost: true, Progress: ProgressCaller})
	fp, err := f.AddRemotePeer(a.AgentMetadata(), a.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
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
	if grant {
		a.expectReads(1)
		defer a.expectReads(0)
	}
	go func() { // a's step loop
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-a.readyChan():
				a.DrainNotifs(nil)
			case <-tick.C:
				if grant {
					a.expectReads(0)
					a.expectReads(1)
				}
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	const window = time.Second
	s0, w0 := a.spun.Load(), a.wakeups.Load()
	time.Sleep(window)
	spun, woke := time.Duration(a.spun.Load()-s0), a.wakeups.Load()-w0
	// Each grant's notification may start a spin (Spin, 50 µs): 20 grants
	// a second. 5 % of the window allows for a loaded machine.
	if spun > window/20 {
		t.Fatalf("under a flood of notifications the progress goroutine spun %v in %v (%d wake-ups)", spun, window, woke)
	}
	t.Logf("under a flood of notifications: spun %v in %v, %d wake-ups", spun, window, woke)
}
