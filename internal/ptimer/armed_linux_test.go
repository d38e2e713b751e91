package ptimer

import (
	"testing"

	"golang.org/x/sys/unix"
)

func armed(t *testing.T, tm *Timer) bool {
	t.Helper()
	if tm.f == nil {
		t.Skip("no timerfd")
	}
	var cur unix.ItimerSpec
	if err := unix.TimerfdGettime(tm.fd, &cur); err != nil {
		t.Fatal(err)
	}
	return cur.Value.Sec != 0 || cur.Value.Nsec != 0
}
