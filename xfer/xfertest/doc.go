// Package xfertest tests data planes and what runs over them.
//
// [Conformance] is the contract every xfer.DataTransport must keep, as a
// test suite: run it against a [Pair] of your data plane. [FakePair] is a
// pair of in-memory data planes, for an engine's deterministic tests of the
// sessions (with a fake clock and an in-memory control plane, as the
// session package's example shows); it passes Conformance.
package xfertest
