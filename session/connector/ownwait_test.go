package connector_test

import (
	"testing"
	"time"
)

// A Pool that waits between its steps reads its producer's answers in its
// own Wait where nothing else brings it what it waits for: over the
// same-host copy. Where the producer pushes a fetch's bytes behind its
// ack (the TCP plane), its waits leave the answers to their connection's
// goroutine, whose hand-off lets one wake see both.
func TestPoolWaitReadsItsAnswers(t *testing.T) {
	for _, shared := range []bool{true, false} {
		// Control on TCP through the proxy, whose delay makes each answer
		// come while the loop waits for it (in one process it may come
		// during the step before).
		w := newPlaneWorld(t, worldConfig{shared: shared, tcpCtl: true})
		w.fetchOK(0) // the contact, and the producer registered
		w.ctl.SetDelay(2 * time.Millisecond)
		before := w.cli.Stats().ReadInWait
		for i := 1; i < 20; i++ {
			w.fetchOK(i)
		}
		read := w.cli.Stats().ReadInWait - before
		switch {
		case shared && read < 10:
			t.Fatalf("same-host copy: %d answers of 19 read in the Pool's own Wait", read)
		case !shared && read > 0:
			t.Fatalf("TCP plane, pushed: %d answers read in the Pool's own Wait", read)
		}
		t.Logf("shared %v: %d answers of 19 fetches read in Wait", shared, read)
	}
}
