//go:build nixlfake

package nixl

import (
	"errors"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/xfer"
)

// While a failed fetch's READ may still write (BlocksHeld, not yet
// Released), a new fetch of the same mm_hash is refused with ErrInFlight,
// as Pool.Fetch says: whether the deadline ended it or its producer's
// silence did.
func TestRefetchWhileHeldIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		why  xfer.Reason
	}{{"deadline", xfer.DeadlineExceeded}, {"producer-silent", xfer.PeerDown}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newPoolWorld(t)
			w.fetchOK(0)
			defer fakeSetHang(false) // before the agents close
			w.hungFetch("1", tc.why)
			w.ctl.Blackhole(false)
			now := time.Now()
			if _, err := w.pool.Fetch(w.ep, "1", w.blocks(poolBlocks), now.Add(time.Second), now); !errors.Is(err, connector.ErrInFlight) {
				t.Fatalf("a fetch of 1 while its READ may still write: %v", err)
			}
		})
	}
}
