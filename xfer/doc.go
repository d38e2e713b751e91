// Package xfer holds the state machine of one transfer on each side and
// the interface to the data plane that moves the bytes.
//
// [ConsumerXfer] follows one fetch from the request to the moment its
// blocks may be reused: waiting_ack, reading, then done, ack_timeout or
// read_failed, or quarantined while a READ that outlived its timeout may
// still write, until settled. [ProducerXfer] is one grant and its lease.
// Both take the caller's time; neither reads a clock.
//
// [DataTransport] is what a data plane provides: agent metadata, the
// per-block mem descriptor, peers, one-sided READs with a completion
// notification, their progress and release. The pure-Go TCP plane
// (transport.TCPData) and NIXL (package nixl) implement it; xfertest has a
// scriptable fake and the conformance suite all of them pass.
//
// Where it differs from the reference's ConsumerXfer: an OK ack is checked
// before the READ is posted; a state check that fails quarantines instead
// of failing (the DMA may still run); a quarantined READ is asked for its
// state before the deadline forces it out, and a forced one says so; a READ
// first seen done after request time + pin lease is not trusted.
package xfer
