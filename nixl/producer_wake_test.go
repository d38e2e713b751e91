//go:build nixlfake

package nixl

import (
	"testing"
	"time"
)

// A Go producer over NIXL behind the real control plane takes a READ's
// notification when its agent signals it, not at its next idle wake-up (a
// second): the grant is unpinned within 200 ms of the fetch completing,
// though Serve was asleep with no grant when the request came and was
// granted on the control plane's goroutine.
func TestProducerOverNIXLUnpinsAtOnce(t *testing.T) {
	w := newPoolWorld(t)
	for item := range 3 {
		w.fetchOK(item)
		done := time.Now()
		for w.prod.Grants() > 0 {
			if time.Since(done) > 200*time.Millisecond {
				t.Fatalf("fetch %d: its grant still pinned 200 ms after it completed; producer %+v", item, w.prod.Stats())
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // Serve goes back to sleep with no grant
	}
}
