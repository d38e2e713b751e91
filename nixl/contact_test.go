//go:build nixl || nixlfake

package nixl

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/xfer"
)

// The agent's plane.Contacter loads a registered producer (queued, by
// default) and has NIXL connect to it before any READ; a READ after it
// completes. An unknown producer is refused, and a closed agent says so.
func TestContactBeforeTheFirstRead(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		for _, post := range []string{"sync", "auto"} {
			t.Run(post, func(t *testing.T) {
				cdata, _ := newAgent(t, v, 8, 4096, withPost(post, Config{}))
				pdata, pr := newAgent(t, v, 8, 4096, Config{})
				pdata.expectReads(1) // a grant is live: the producer is driven
				c := plane.ContacterOf(cdata)
				if c == nil {
					t.Fatal("an Agent has no Contacter")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := c.Contact(ctx, "nobody", nil); !errors.Is(err, xfer.ErrUnknownPeer) {
					t.Fatalf("contact with an unknown peer: %v", err)
				}
				peer, err := cdata.AddRemotePeer(pdata.AgentMetadata(), pdata.MemDescriptor())
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Contact(ctx, peer.Agent, nil); err != nil {
					t.Fatal(err)
				}
				if !cdata.fakeConnected(peer.Agent) {
					t.Fatal("NIXL was not asked to connect")
				}
				xfertestFill(pr.Block(3), 7)
				h, err := cdata.PostRead([]int{1}, peer.Agent, []int{3}, []byte("n"))
				if err != nil {
					t.Fatal(err)
				}
				if p := waitEnded(t, cdata, h); p != xfer.Complete {
					t.Fatalf("READ after the contact: %s", p)
				}
				cdata.Release(h)
				cdata.Close()
				if err := c.Contact(ctx, peer.Agent, nil); !errors.Is(err, xfer.ErrClosed) {
					t.Fatalf("contact on a closed agent: %v", err)
				}
			})
		}
	})
}

// A contact's notification names no grant: it ends in ":" +
// wirext.ContactHash, which producers drop, whatever the agent's name,
// and is as long as a READ's (see contactNotif) unless the name alone is
// longer.
func TestContactNotifNamesNoGrant(t *testing.T) {
	for _, name := range []string{"c", "consumer-7#12.abc", strings.Repeat("n", 300)} {
		n := contactNotif(name)
		if !bytes.HasPrefix(n, []byte(name)) || !bytes.HasSuffix(n, []byte(":"+wirext.ContactHash)) {
			t.Fatalf("%q: %q", name, n)
		}
		if len(n) < contactNotifLen {
			t.Fatalf("%q: %d bytes, want at least %d", name, len(n), contactNotifLen)
		}
		if _, _, _, ok := wirext.SplitNotifGrant(n); ok {
			t.Fatalf("%q: %q reads as a grant's notification", name, n)
		}
	}
}
