package wire

import (
	"bytes"
	"testing"
)

// copyBlob must be copy at every alignment and length, its split path
// (aligned destination, unaligned source, 2 KiB and more) included.
func TestCopyBlob(t *testing.T) {
	src := make([]byte, 5000)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	dst := make([]byte, 5000+32)
	for _, n := range []int{0, 1, 100, 2047, 2048, 2049, 4096, 4999 - 16} {
		for so := 0; so < 17; so++ {
			for do := 0; do < 17; do++ {
				clear(dst)
				d, s := dst[do:do+n], src[so:so+n]
				if got := copyBlob(d, s); got != n || !bytes.Equal(d, s) {
					t.Fatalf("n %d, offsets %d/%d: copied %d, equal %v", n, so, do, got, bytes.Equal(d, s))
				}
				if bytes.ContainsFunc(dst[:do], func(r rune) bool { return r != 0 }) || bytes.ContainsFunc(dst[do+n:], func(r rune) bool { return r != 0 }) {
					t.Fatalf("n %d, offsets %d/%d: wrote outside the destination", n, so, do)
				}
			}
		}
	}
	if got := copyBlob(dst[:10], src[:3000]); got != 10 || !bytes.Equal(dst[:10], src[:10]) {
		t.Fatalf("short destination: copied %d", got)
	}
	got := appendBlob(make([]byte, 7, 64), src[1:2500])
	if !bytes.Equal(got, src[1:2500]) {
		t.Fatal("appendBlob: wrong bytes")
	}
}
