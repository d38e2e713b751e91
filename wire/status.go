package wire

import "strconv"

// ConnectorVersion is the protocol version this library speaks.
const ConnectorVersion = 2

// Status is the outcome an [XferAck] reports.
type Status uint8

// The status values; their numbers are on the wire.
const (
	OK           Status = 0 // granted: the ack carries blocks, metadata, descriptor
	NackMissing  Status = 1 // the producer does not hold the entry
	NackIncompat Status = 2 // compatibility hashes differ
	NackVersion  Status = 3 // connector versions differ
	NackInternal Status = 4 // producer error, or a request without a session id
	NackNotReady Status = 5 // announced, but its save has not landed yet
)

// maxStatus is the largest value the enum accepts.
const maxStatus = NackNotReady

var statusNames = [...]string{"OK", "NACK_MISSING", "NACK_INCOMPAT", "NACK_VERSION", "NACK_INTERNAL", "NACK_NOT_READY"}

// String returns the reference's name for s, e.g. "NACK_NOT_READY".
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Error makes a Status an error: errors.Is(err, wire.NackMissing).
func (s Status) Error() string { return s.String() }

// Retryable reports whether asking again may succeed: only NackNotReady.
func (s Status) Retryable() bool { return s == NackNotReady }
