// Package xfertest tests data planes and what runs over them: [Conformance]
// checks that an xfer.DataTransport keeps its contract, and [FakePair] is a
// pair of in-memory data planes for deterministic tests of the sessions (the
// session package's example uses it).
package xfertest
