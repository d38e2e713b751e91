// Package xfertest tests data planes: [Conformance] checks that an
// xfer.DataTransport keeps its contract, and [FakePair] gives two in-memory
// data planes for deterministic tests of what runs over them.
package xfertest
