package wake

import "time"

// fallback is a channel and a Go timer, where there is no eventfd.
type fallback struct {
	c  chan struct{}
	gt *time.Timer
}

func (w *Waiter) initFallback() {
	w.c = make(chan struct{}, 1)
	w.gt = time.NewTimer(time.Hour)
	w.gt.Stop()
}

func (w *Waiter) kickFallback() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

func (w *Waiter) armFallback(d time.Duration) {
	w.gt.Stop()
	if d > 0 {
		w.gt.Reset(d)
	}
}

func (w *Waiter) drainFallback() {
	select {
	case <-w.c:
	default:
	}
}

func (w *Waiter) blockFallback() {
	select {
	case <-w.c:
	case <-w.gt.C:
	}
}

func (w *Waiter) closeFallback() {
	if w.gt != nil {
		w.gt.Stop()
	}
}
