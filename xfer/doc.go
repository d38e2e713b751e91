// Package xfer holds the contracts between the protocol's sessions and the
// outside world, and the vocabulary of one transfer.
//
// [DataTransport] is what a data plane provides; transport.TCPData and
// package nixl implement it. To bring your own, implement it and run
// xfertest.Conformance against it (see its example). [Message], [Inbound],
// [Death] and [ErrQueueFull], [ErrPeerDown], [ErrNotAllowed] and
// [ErrPeerSilent] are a control plane's side. [Reason] says why a transfer
// ended as it did. Every component of the module returns [ErrClosed] once
// closed, and every constructor [ErrBadConfig] for a configuration it cannot
// run with. Design notes: docs/design.md in the repository.
package xfer
