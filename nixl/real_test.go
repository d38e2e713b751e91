//go:build nixl

package nixl

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Real NIXL over UCX's TCP and shared-memory transports (the latter needs
// the error handling mode none, see docs/nixl.md).
var variants = []variant{
	{name: "tcp", tls: "tcp"},
	{name: "sm", tls: "sm", params: map[string]string{"ucx_error_handling_mode": "none"}},
}

// needNIXL skips a test when New reports that NIXL is not installed, and
// fails it under CI=true, where NIXL must be there.
func needNIXL(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrNotInstalled) && !errors.Is(err, ErrNotBuilt) {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but NIXL is missing: %v", err)
	}
	t.Skipf("no NIXL; to run these tests: export NIXL=$PWD/../shared/nixl; "+
		`CGO_LDFLAGS="-Wl,-rpath,$NIXL/lib" go test -tags nixl ./nixl/ (%v)`, err)
}

// A producer's descriptor is kept as its shape when its blocks are back to
// back (wire.AppendBlockDescs, what every Go producer sends), and as a list
// NIXL prepares otherwise: here the same region listed in reverse, so that
// remote id i is the producer's block 15-i. READs of runs (merged), of
// scattered ids (one descriptor each) and of single blocks land the
// blocks their ids name under both.
func TestRemoteShapes(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		const n, bs = 16, 4096
		p, pr := newAgent(t, v, n, bs, Config{})
		for i := range n {
			xfertestFill(pr.Block(i), byte(i))
		}
		p.expectReads(1)
		reversed := make([]wire.MemDesc, n)
		for i := range reversed {
			reversed[i] = wire.MemDesc{Addr: wire.UintOf(uint64(pr.Base()) + uint64(n-1-i)*bs), Size: wire.UintOf(bs), Device: wire.IntOf(0)}
		}
		for _, shape := range []struct {
			name string
			desc []byte
			at   func(id int) int // the producer's block remote id names
		}{
			{"back to back", p.MemDescriptor(), func(id int) int { return id }},
			{"listed in reverse", wire.AppendMemDescs(nil, reversed), func(id int) int { return n - 1 - id }},
		} {
			t.Run(shape.name, func(t *testing.T) {
				c, cr := newAgent(t, v, n, bs, Config{})
				peer, err := c.AddRemotePeer(p.AgentMetadata(), shape.desc)
				if err != nil {
					t.Fatal(err)
				}
				if peer.Blocks != n {
					t.Fatalf("peer %+v", peer)
				}
				for _, r := range []struct{ local, remote []int }{
					{[]int{0, 1, 2, 3, 4, 5, 6, 7}, []int{8, 9, 10, 11, 12, 13, 14, 15}},
					{[]int{8, 10, 12}, []int{7, 2, 5}},
					{[]int{15}, []int{0}},
				} {
					clear(cr.Bytes())
					h, err := c.PostRead(r.local, peer.Agent, r.remote, []byte("s:shape"))
					if err != nil {
						t.Fatal(err)
					}
					for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Microsecond) {
						pg, err := c.Check(h)
						if err != nil || pg == xfer.Failed || time.Now().After(deadline) {
							t.Fatalf("READ %v <- %v: %v, %v", r.local, r.remote, pg, err)
						}
						if pg == xfer.Complete {
							break
						}
					}
					c.Release(h)
					for i, l := range r.local {
						if !bytes.Equal(cr.Block(l), pr.Block(shape.at(r.remote[i]))) {
							t.Fatalf("READ %v <- %v: local block %d does not hold remote id %d", r.local, r.remote, l, r.remote[i])
						}
					}
				}
			})
		}
	})
}

// fakeConnected is the C fake's record of a connection; real NIXL keeps
// none to ask, and the READ after it shows the connection.
func (a *Agent) fakeConnected(string) bool { return true }

// Over UCX shared memory a READ completes within its post, its
// notification sent too, once the endpoint's message lane is connected.
// Contact connects it (its notification is as long as a READ's), so the
// first READ after a contact ends within its post, as later ones do,
// instead of waiting for a round trip through the producer's progress.
func TestFirstReadAfterContactEndsInItsPost(t *testing.T) {
	v := variants[1]
	if v.tls != "sm" {
		t.Fatalf("variant %s is not UCX shared memory", v.name)
	}
	v.env(t)
	cdata, _ := newAgent(t, v, 8, 4096, withPost("sync", Config{}))
	pdata, pr := newAgent(t, v, 8, 4096, Config{})
	pdata.expectReads(1) // a grant is live: the producer is driven
	peer, err := cdata.AddRemotePeer(pdata.AgentMetadata(), pdata.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := plane.ContacterOf(cdata).Contact(ctx, peer.Agent, plane.Contact{}); err != nil {
		t.Fatal(err)
	}
	xfertestFill(pr.Block(3), 9)
	// As long as a grant's "<sid>:<mm_hash>#<id>.<token>".
	notif := bytes.Repeat([]byte("n"), 130)
	h, err := cdata.PostRead([]int{1}, peer.Agent, []int{3}, notif)
	if err != nil {
		t.Fatal(err)
	}
	cdata.mu.Lock()
	r := cdata.handles[h]
	inPost := r != nil && r.ended
	cdata.mu.Unlock()
	if !inPost {
		t.Error("the first READ after a contact ran on past its post: its notification waited for the producer")
	}
	if p := waitEnded(t, cdata, h); p != xfer.Complete {
		t.Fatalf("READ: %s", p)
	}
	cdata.Release(h)
}
