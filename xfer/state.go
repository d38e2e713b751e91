package xfer

import "fmt"

// Reason says why a transfer ended the way it did.
type Reason uint8

const (
	NoReason           Reason = iota
	Nacked                    // the producer refused it (see the NACK status)
	AckTimedOut               // no ack before the ack deadline
	PeerDown                  // the producer was declared dead
	BadAck                    // the OK ack did not fit the request (counts, ids)
	RegisterFailed            // the producer's agent could not be registered
	PostFailed                // the data plane refused the READ
	ReadError                 // the data plane reported the READ failed
	ReadTimedOut              // the READ outlived the read timeout
	CheckFailed               // the data plane could not tell the READ's state
	LateCompletion            // done only after the producer's pin lease could have run out
	QuarantineTimedOut        // forced out of quarantine at its deadline
	Closed                    // the session was closed
	Canceled                  // the caller canceled the fetch
	DeadlineExceeded          // the fetch's deadline passed before it completed
)

var reasonNames = [...]string{"", "nacked", "ack-timeout", "peer-down", "bad-ack", "register-failed",
	"post-failed", "read-error", "read-timeout", "check-failed", "late-completion", "quarantine-timeout", "closed", "canceled", "deadline"}

// Error makes a Reason an error: errors.Is(err, xfer.Nacked), errors.As.
func (r Reason) Error() string { return r.String() }

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", r)
}
