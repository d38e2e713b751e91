//go:build nixl

package nixl

import (
	"bytes"
	"testing"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A producer's shape or descriptor that names memory it never registered
// (past its region, astride its end, somewhere else). Through a shape,
// whose READs NIXL checks against the producer's registrations, the READ
// ends Failed and writes nothing. Through a list NIXL prepares, NIXL
// 1.4.0 checks less: here it served blocks past the registration (the
// producer's own memory; see docs/nixl.md, "Trust"). Either
// way nothing crashes, every READ ends, and nothing is written but the
// local block the READ named.
func TestRemoteOutsideRegistration(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		const n, bs, local = 8, 4096, 3
		p, _ := newAgent(t, v, n, bs, Config{})
		p.expectReads(1)
		own, _, err := wire.DecodeBlocks(p.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name  string
			shape wire.Blocks
			id    int // a block outside the producer's registration
		}{
			{"past the region", wire.Blocks{Base: own.Base, Size: own.Size, Count: 4 * n}, n + 1},
			{"astride its end", wire.Blocks{Base: own.Base + bs/2, Size: own.Size, Count: n}, n - 1},
			{"elsewhere", wire.Blocks{Base: own.Base + 1<<30, Size: own.Size, Count: n}, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c, cr := newAgent(t, v, n, bs, Config{})
				for i := range n {
					xfertestFill(cr.Block(i), 0xee)
				}
				before := bytes.Clone(cr.Bytes())
				untouched := func() bool {
					return bytes.Equal(cr.Bytes()[:local*bs], before[:local*bs]) &&
						bytes.Equal(cr.Bytes()[(local+1)*bs:], before[(local+1)*bs:])
				}
				peer, err := c.addRemotePeerShape(p.AgentMetadata(), tc.shape)
				if err != nil {
					t.Fatalf("AddRemotePeerShape: %v (NIXL checks at the READ)", err)
				}
				h, err := c.PostRead([]int{local}, peer.Agent, []int{tc.id}, []byte("s:outside"))
				if err == nil {
					if pg := waitEnded(t, c, h); pg != xfer.Failed {
						t.Fatalf("READ of unregistered memory through a shape: %v", pg)
					}
					c.Release(h)
				}
				if !bytes.Equal(cr.Bytes(), before) {
					t.Fatal("a refused READ wrote into the region")
				}

				// The same blocks as a list (not back to back, so kept
				// as one), whose remote id 0 is the block outside.
				list := make([]wire.MemDesc, tc.shape.Count)
				for i := range list {
					list[i] = wire.MemDesc{Addr: wire.UintOf(tc.shape.Base + uint64(i)*bs), Size: wire.UintOf(bs), Device: wire.IntOf(0)}
				}
				list[0], list[tc.id] = list[tc.id], list[0]
				peer, err = c.AddRemotePeer(p.AgentMetadata(), wire.AppendMemDescs(nil, list))
				if err != nil {
					t.Logf("list refused: %v", err)
					return
				}
				h, err = c.PostRead([]int{local}, peer.Agent, []int{0}, []byte("s:outside"))
				if err != nil {
					t.Logf("READ through the list refused: %v", err)
				} else {
					pg := waitEnded(t, c, h)
					c.Release(h)
					t.Logf("READ through the list: %v", pg)
				}
				if !untouched() {
					t.Fatal("a READ wrote outside the local block it named")
				}
			})
		}
	})
}
