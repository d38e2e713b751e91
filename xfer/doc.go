// Package xfer holds the contracts between the sessions and the outside
// world. [DataTransport] is a data plane, implemented by transport.TCPData
// and package nixl; to bring your own, run xfertest.Conformance against it.
// [Reason] says why a transfer ended. Every component returns [ErrClosed]
// once closed, and every constructor [ErrBadConfig] for a configuration it
// cannot run with.
package xfer
