package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// grantsHeld is a producer whose grants never end: its Shutdown lasts as
// long as its context.
type grantsHeld int

func (g grantsHeld) Grants() int { return int(g) }

func (g grantsHeld) Shutdown(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// The first interrupt says what the producer waits for and how long at
// most; a second one ends the wait at once.
func TestShutdownSaysWhatItWaitsFor(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	sigs <- os.Interrupt // the second interrupt
	var w bytes.Buffer
	err := shutdown(grantsHeld(3), sigs, time.Hour, &w)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("shutdown: %v, want it cut short", err)
	}
	if want := "producer: stopping: waiting up to 1h0m0s for 3 READs under way (interrupt again to exit at once)\n"; w.String() != want {
		t.Fatalf("said %q, want %q", w.String(), want)
	}

	w.Reset()
	if err := shutdown(grantsHeld(0), nil, time.Nanosecond, &w); !errors.Is(err, context.DeadlineExceeded) || w.String() != "producer: stopping\n" {
		t.Fatalf("shutdown: %v, said %q", err, w.String())
	}
}
