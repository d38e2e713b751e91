//go:build !linux

package ptimer

import "time"

type impl struct{}

func (t *Timer) init()               { t.initGo() }
func (t *Timer) arm(d time.Duration) { t.armGo(d) }

// Close stops the timer.
func (t *Timer) Close() error {
	t.gt.Stop()
	return nil
}
