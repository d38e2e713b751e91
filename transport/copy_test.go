package transport

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ecxfer/ecxfer/xfer"
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
			seed := byte(rng.Uint32())
			for i := range src {
				src[i] = byte(i*7+i>>9) + seed
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

// A same-host READ large enough to be copied by several goroutines lands
// every block where its ids say, with runs of many lengths on both sides.
func TestSharedLargeRead(t *testing.T) {
	const blocks, size = 1024, 8 << 10
	cr, pr := newRegion(t, blocks, size), newSharedRegion(t, blocks, size)
	for b := range blocks {
		for i := range pr.Block(b) {
			pr.Block(b)[i] = pattern(b, i)
		}
	}
	c := newTCP(t, cr, TCPConfig{CopyWorkers: 3})
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	// Runs of 1 to 40 blocks, taken in a shuffled order on each side.
	var local, remote []int
	for start := 0; start < 900; {
		n := min(1+rng.IntN(40), 900-start)
		for b := start; b < start+n; b++ {
			local = append(local, b)
		}
		start += n
	}
	remote = rng.Perm(blocks)[:len(local)]
	slices.Sort(remote[:len(remote)/2]) // long runs in the first half
	if len(local)*size < 2*parallelCopyMin {
		t.Fatalf("READ of %d bytes is not split", len(local)*size)
	}
	h, err := c.PostRead(local, peer.Agent, remote, []byte("s:m"))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitEnd(t, c, h); got != xfer.Complete || c.copies.Load() != 1 {
		t.Fatalf("READ: %v, %d copies", got, c.copies.Load())
	}
	for i, b := range local {
		if !bytes.Equal(cr.Block(b), pr.Block(remote[i])) {
			t.Fatalf("local block %d does not hold remote block %d", b, remote[i])
		}
	}
}
