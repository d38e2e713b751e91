//go:build nixl || nixlfake

package nixl

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// The agent's plane.Contacter loads a registered producer (queued, by
// default) and has NIXL connect to it before any READ; a READ after it
// completes. An unknown producer is refused, and a closed agent says so.
func TestContactBeforeTheFirstRead(t *testing.T) {
	forContactPairs(t, 8, func(t *testing.T, cdata *Agent, _ *cache.Region, pdata *Agent, pr *cache.Region) {
		c := plane.ContacterOf(cdata)
		if c == nil {
			t.Fatal("an Agent has no Contacter")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Contact(ctx, "nobody", plane.Contact{}); !errors.Is(err, xfer.ErrUnknownPeer) {
			t.Fatalf("contact with an unknown peer: %v", err)
		}
		peer, err := cdata.AddRemotePeer(pdata.AgentMetadata(), pdata.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Contact(ctx, peer.Agent, plane.Contact{}); err != nil {
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
		if err := c.Contact(ctx, peer.Agent, plane.Contact{}); !errors.Is(err, xfer.ErrClosed) {
			t.Fatalf("contact on a closed agent: %v", err)
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

// touchBytes is a's touch page.
func touchBytes(a *Agent) []byte { return unsafe.Slice((*byte)(a.touchPage), a.touch.Size) }

// A contact reads the touch page the producer named into the consumer's
// own touch page, and nothing else: the consumer's blocks keep their
// bytes, and the READ is released once it ended. A page that cannot be
// one (longer than ours, more than one block, outside the producer's
// registered memory, past the end of the address space) is not read, and
// the contact succeeds all the same.
func TestContactReadsOnlyTheTouchPage(t *testing.T) {
	forContactPairs(t, 4, func(t *testing.T, cdata *Agent, cr *cache.Region, pdata *Agent, _ *cache.Region) {
		touch := plane.TouchPageOf(pdata)
		if touch.Count != 1 || touch.Size == 0 || touch.Base == 0 {
			t.Fatalf("touch page %+v", touch)
		}
		peer, err := cdata.AddRemotePeer(pdata.AgentMetadata(), pdata.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		for i := range cr.Blocks() {
			xfertestFill(cr.Block(i), byte(40+i))
		}
		want := bytes.Repeat([]byte{0xa5}, int(touch.Size))
		copy(touchBytes(pdata), want)
		mine := touchBytes(cdata)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := plane.ContacterOf(cdata)
		for _, odd := range []wire.Blocks{
			{Base: touch.Base, Size: touch.Size + 1, Count: 1},
			{Base: touch.Base, Size: touch.Size / 2, Count: 2},
			{Base: 64, Size: touch.Size, Count: 1},
			{Base: math.MaxUint64 - touch.Size + 1, Size: touch.Size, Count: 1}, // NIXL's check wraps
		} {
			if err := c.Contact(ctx, peer.Agent, plane.Contact{Touch: odd}); err != nil {
				t.Fatalf("contact with touch page %+v: %v", odd, err)
			}
			settled(t, cdata)
			if !bytes.Equal(mine, make([]byte, len(mine))) {
				t.Fatalf("touch page %+v was read", odd)
			}
		}
		if err := c.Contact(ctx, peer.Agent, plane.Contact{Touch: touch}); err != nil {
			t.Fatal(err)
		}
		settled(t, cdata)
		if !bytes.Equal(mine, want) {
			t.Fatalf("the consumer's touch page holds %x, want the producer's %x", mine, want)
		}
		for i := range cr.Blocks() {
			w := make([]byte, cr.BlockSize())
			xfertestFill(w, byte(40+i))
			if !bytes.Equal(cr.Block(i), w) {
				t.Fatalf("the contact wrote into block %d", i)
			}
		}
	})
}

// settled drives a until it holds no READ that ended unreleased or runs.
func settled(t *testing.T, a *Agent) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.DrainNotifs(nil)
		a.mu.Lock()
		n := len(a.zombies) + len(a.ended) + len(a.touches)
		a.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d READs left after 10 s", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// forContactPairs runs f, for each variant and post mode, on a consumer
// agent and a producer agent of blocks blocks of 4 KiB each, and their
// regions; the producer has a grant live, so that it is driven.
func forContactPairs(t *testing.T, blocks int, f func(t *testing.T, cdata *Agent, cr *cache.Region, pdata *Agent, pr *cache.Region)) {
	forVariants(t, func(t *testing.T, v variant) {
		for _, post := range []string{"sync", "auto"} {
			t.Run(post, func(t *testing.T) {
				cdata, cr := newAgent(t, v, blocks, 4096, withPost(post, Config{}))
				pdata, pr := newAgent(t, v, blocks, 4096, Config{})
				pdata.expectReads(1)
				f(t, cdata, cr, pdata, pr)
			})
		}
	})
}
