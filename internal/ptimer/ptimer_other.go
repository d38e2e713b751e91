//go:build !linux

package ptimer

import "time"

type impl struct{ gt *time.Timer }

func (t *Timer) init() {
	t.gt = time.AfterFunc(time.Hour, t.fire)
	t.gt.Stop()
}

func (t *Timer) arm(d time.Duration) {
	if d == 0 {
		t.gt.Stop()
	} else {
		t.gt.Reset(d)
	}
}

// Close stops the timer.
func (t *Timer) Close() error {
	t.gt.Stop()
	return nil
}
