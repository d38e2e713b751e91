//go:build !linux

package wake

import "time"

type impl struct{ fallback }

func (w *Waiter) init()               { w.initFallback() }
func (w *Waiter) kick()               { w.kickFallback() }
func (w *Waiter) arm(d time.Duration) { w.armFallback(d) }
func (w *Waiter) block()              { w.blockFallback() }
func (w *Waiter) drain()              { w.drainFallback() }

// Close releases the timer.
func (w *Waiter) Close() error {
	w.closeFallback()
	return nil
}
