package session

import (
	"strconv"
	"strings"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Outcome is how one transfer ended, or that it entered quarantine.
type Outcome struct {
	MMHash string
	Blocks []int       // the local blocks given to StartXfer
	Reason xfer.Reason // why, when it is not the happy path
	Status wire.Status // the NACK, when Reason is xfer.Nacked
	// Err is the cause, where there is one beyond Reason and Status: why
	// the producer could not be registered (xfer.RegisterFailed) or the
	// READ not posted. Nil otherwise.
	Err error
	// Forced is set on a Settled outcome whose READ was given up at the
	// quarantine deadline without the data plane confirming it ended: its
	// blocks may still be written. Keep them out of use if you can.
	Forced bool
}

// Results are the outcomes since the last TakeResults, in the order they
// happened. Each transfer appears in exactly one of Completed, Tombstoned,
// Retryable and Settled once it ends, and in Quarantined when it enters
// quarantine (before it settles).
type Results struct {
	Completed   []Outcome // blocks hold the entry: promote them
	Tombstoned  []Outcome // free the blocks; do not retry this mm_hash now
	Quarantined []Outcome // a READ may still write: do NOT free the blocks
	Retryable   []Outcome // free the blocks; another attempt may succeed
	Settled     []Outcome // a quarantined READ ended: the blocks may be freed
}

// Reset empties r, keeping its capacity.
func (r *Results) Reset() {
	r.Completed = r.Completed[:0]
	r.Tombstoned = r.Tombstoned[:0]
	r.Quarantined = r.Quarantined[:0]
	r.Retryable = r.Retryable[:0]
	r.Settled = r.Settled[:0]
}

// Len returns the number of outcomes held.
func (r *Results) Len() int {
	return len(r.Completed) + len(r.Tombstoned) + len(r.Quarantined) + len(r.Retryable) + len(r.Settled)
}

// appendTo appends every outcome of r to dst.
func (r *Results) appendTo(dst *Results) {
	dst.Completed = append(dst.Completed, r.Completed...)
	dst.Tombstoned = append(dst.Tombstoned, r.Tombstoned...)
	dst.Quarantined = append(dst.Quarantined, r.Quarantined...)
	dst.Retryable = append(dst.Retryable, r.Retryable...)
	dst.Settled = append(dst.Settled, r.Settled...)
}

// NackCounts counts NACKs by status: n[wire.NackMissing] and so on.
type NackCounts [6]uint64

// String lists the statuses counted, e.g. "NACK_MISSING 1002,
// NACK_NOT_READY 3", or says "none".
func (n NackCounts) String() string {
	var b strings.Builder
	for st, c := range n {
		if c == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(wire.Status(st).String())
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(c, 10))
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}
