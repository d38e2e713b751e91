// Package doccheck holds tests of what the README claims: that its
// figures are the recorded ones, and that CI checks what it says is
// checked. It has no code of its own.
package doccheck
