package transport

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// copyParallel lands every byte where one copy per span would, whatever
// the span sizes, the number of goroutines and where chunks cut spans.
func TestCopyParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 40 {
		var spans []copySpan
		total := 0
		for range 1 + rng.IntN(12) {
			n := 1 + rng.IntN(3*copyChunk)
			if trial%4 == 0 {
				n = copyChunk // cuts on span boundaries
			}
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			spans = append(spans, copySpan{dst: make([]byte, n), src: src, off: total})
			total += n
		}
		w := 1 + trial%4
		copyParallel(spans, total, w)
		for i, s := range spans {
			if !bytes.Equal(s.dst, s.src) {
				t.Fatalf("trial %d, %d goroutines: span %d of %d (%d bytes) differs", trial, w, i, len(spans), len(s.src))
			}
		}
	}
}

// copyRange copies exactly [from, to) of the spans' concatenation.
func TestCopyRange(t *testing.T) {
	spans := []copySpan{
		{dst: make([]byte, 3), src: []byte("abc"), off: 0},
		{dst: make([]byte, 2), src: []byte("de"), off: 3},
		{dst: make([]byte, 4), src: []byte("fghi"), off: 5},
	}
	copyRange(spans, 2, 6)
	got := string(bytes.Join([][]byte{spans[0].dst, spans[1].dst, spans[2].dst}, []byte("|")))
	if want := "\x00\x00c|de|f\x00\x00\x00"; got != want {
		t.Fatalf("copied %q, want %q", got, want)
	}
}
