// Package doccheck holds tests of what the README claims: that its
// figures are the recorded ones, and that CI checks what it says is
// checked; and that go doc stays a short reference. It has no code of
// its own.
package doccheck
