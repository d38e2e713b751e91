//go:build !linux

package transport

import (
	"context"
	"time"
)

// bell is a no-op where there is no eventfd: owners wait on channels.
type bell struct{}

func (*bell) ring()  {}
func (*bell) close() {}

// pollWait is not available here: the caller waits on its channels.
func (st *stepReads) pollWait(context.Context, <-chan struct{}, time.Duration, waitSource) (woke, handled bool) {
	return false, false
}
