package connector_test

import (
	"testing"
)

// A Pool that waits between its steps reads its producer's answers in its
// own Wait where nothing else brings it what it waits for: over the
// same-host copy. Where the producer pushes a fetch's bytes behind its
// ack (the TCP plane), its waits leave the answers to their connection's
// goroutine, whose hand-off lets one wake see both.
func TestPoolWaitReadsItsAnswers(t *testing.T) {
	for _, shared := range []bool{true, false} {
		w := newPlaneWorld(t, worldConfig{shared: shared})
		w.fetchOK(0) // the contact, and the producer registered
		before := w.cli.Stats().ReadInWait
		for i := 1; i < 20; i++ {
			w.fetchOK(i)
		}
		read := w.cli.Stats().ReadInWait - before
		switch {
		case shared && read == 0:
			t.Fatal("same-host copy: no answer read in the Pool's own Wait")
		case !shared && read > 0:
			t.Fatalf("TCP plane, pushed: %d answers read in the Pool's own Wait", read)
		}
		t.Logf("shared %v: %d answers of 19 fetches read in Wait", shared, read)
	}
}
