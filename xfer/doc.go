// Package xfer holds the contracts between the protocol's sessions and the
// outside world, and the vocabulary of one transfer.
//
// [DataTransport] is what a data plane provides: one-sided READs of a peer's
// blocks with a completion notification. transport.TCPData and package nixl
// implement it; to bring your own, implement it and run xfertest.Conformance
// against it (see its example). [Message], [Inbound], [Death] and the errors
// [ErrQueueFull], [ErrPeerDown], [ErrNotAllowed] and [ErrPeerSilent] are a
// control plane's side, so that session/connector drives any control plane.
//
// [Reason] says why a transfer ended as it did, and [Config] holds its
// timeouts. Every component of the module returns [ErrClosed] once closed,
// and every constructor [ErrBadConfig] for a configuration it cannot run
// with.
//
// Design notes: docs/design.md.
package xfer
