package fsm

import "fmt"

// State is where a transfer stands on the consumer side.
type State uint8

const (
	WaitingAck  State = iota // XferReq sent, no ack yet
	Reading                  // READ posted
	Done                     // READ complete: promote the blocks
	AckTimeout               // no ack in time: free the blocks, may retry
	ReadFailed               // the READ failed or was refused: free the blocks
	Quarantined              // the READ may still write: keep the blocks
	Settled                  // a quarantined READ has ended: blocks may be freed
)

var stateNames = [...]string{"waiting_ack", "reading", "done", "ack_timeout", "read_failed", "quarantined", "settled"}

// String returns the reference's name for s, e.g. "waiting_ack".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// Terminal reports whether no further transition can happen.
func (s State) Terminal() bool {
	return s == Done || s == AckTimeout || s == ReadFailed || s == Settled
}
