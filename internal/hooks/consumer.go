package hooks

import (
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Consumer is what connector.Pool uses of a *session.ConsumerSession beyond
// its public methods: the contact request ahead of the first fetch, the
// producer's registration, and memory upkeep.
type Consumer interface {
	// Contact asks the producer for its data-plane contact.
	Contact(deadline, now time.Time) error
	// Contacted reports the outcome of the last contact request: done is
	// false while it waits; again says it ended without an answer (none
	// in time, or the connection died), and may be asked again.
	Contacted() (done, again bool, st wire.Status, err error)
	// ContactOf is what the contact answer gave the data plane's contact.
	ContactOf() plane.Contact
	// Registered returns the producer as the data plane knows it.
	Registered() (xfer.Peer, bool)
	// Probing: the first request or contact is unanswered.
	Probing() bool
	// Trim gives back memory kept for a past peak.
	Trim()
	// End ends the transfer of mmHash at now as Cancel does, for why.
	End(mmHash string, now time.Time, why xfer.Reason) error
}

// ConsumerOf returns s's Consumer; s is a *session.ConsumerSession.
var ConsumerOf func(s any) Consumer

// StopGranting starts a *connector.Producer's graceful shutdown without
// waiting for it (the simulator steps the producer itself).
var StopGranting func(p any)
