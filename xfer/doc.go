// Package xfer holds the contracts between the protocol's sessions and the
// outside world, and the vocabulary of one transfer.
//
// [DataTransport] is what a data plane provides: agent metadata, the
// per-block mem descriptor, peers, one-sided READs with a completion
// notification, their progress and release. The pure-Go TCP plane
// (transport.TCPData) and NIXL (package nixl) implement it; users may write
// their own and test it with xfertest.Conformance (see its example). The
// sessions get more out of this module's own planes (a channel that
// signals work, a Release that stops a READ for certain, producers
// registered from their region's shape) through an internal interface; a
// plane of your own is polled and followed as the contract alone allows.
//
// [Message], [Inbound] and the errors [ErrQueueFull], [ErrPeerDown] and
// [ErrNotAllowed] are a control plane's side of the contract, so that
// session/connector drives any control plane without linking one.
//
// [Reason] says why a transfer ended the way it did; [Config] holds its
// timeouts. [ErrClosed] is the one "closed" error of every component of
// the module, [ErrBadConfig] the one of constructors.
//
// The design, and why (where a transfer differs from vLLM's reference):
// docs/design.md in the repository.
package xfer
