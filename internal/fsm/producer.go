package fsm

import "time"

// ProducerXfer is one grant on the producer side: a consumer session may
// READ these blocks of the entry until the deadline, and the entry stays
// pinned until the completion notification or the deadline.
type ProducerXfer struct {
	MMHash    string
	SessionID string
	Blocks    []int
	Deadline  time.Time
}

// Expired reports whether the lease ran out: now is strictly after the
// deadline.
func (p *ProducerXfer) Expired(now time.Time) bool { return now.After(p.Deadline) }
