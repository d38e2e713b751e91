// Package xfertest tests data planes: [Conformance] checks a DataTransport's
// contract; [FakePair] gives in-memory ones for deterministic tests.
package xfertest
