package session

import (
	"strconv"
	"strings"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Outcome is how one transfer ended, or that its blocks came back.
type Outcome struct {
	MMHash     string
	Blocks     []int       // the local blocks given to StartXfer
	Reason     xfer.Reason // why it failed; xfer.NoReason when it completed
	Status     wire.Status // the NACK, when Reason is xfer.Nacked
	Err        error       // the cause beyond Reason and Status, if any; on a Released, why Forced
	Retry      bool        // on a failure: another attempt may succeed
	BlocksHeld bool        // on a failure: reuse Blocks only after their Released
	Forced     bool        // on a Released: never confirmed stopped; keep out of use
}

// Results are the outcomes since the last TakeResults, in order. A transfer
// ends once, in Completed or Failed; one BlocksHeld later has one Released.
type Results struct {
	Completed []Outcome // the blocks hold the entry
	Failed    []Outcome // ended without the entry
	Released  []Outcome // the blocks of a failure with BlocksHeld, free now
}

// Reset empties r, keeping its capacity.
func (r *Results) Reset() {
	clear(r.Completed)
	clear(r.Failed)
	clear(r.Released)
	r.Completed, r.Failed, r.Released = r.Completed[:0], r.Failed[:0], r.Released[:0]
}

// Len returns the number of outcomes held.
func (r *Results) Len() int { return len(r.Completed) + len(r.Failed) + len(r.Released) }

// appendTo appends every outcome of r to dst.
func (r *Results) appendTo(dst *Results) {
	dst.Completed = append(dst.Completed, r.Completed...)
	dst.Failed = append(dst.Failed, r.Failed...)
	dst.Released = append(dst.Released, r.Released...)
}

// NackCounts counts NACKs by status: n[wire.NackMissing] and so on.
type NackCounts [6]uint64

// String lists the counts ("NACK_MISSING 2, NACK_NOT_READY 3") or "none".
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
