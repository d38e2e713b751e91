//go:build nixlfake

package nixl

import (
	"errors"
	"testing"

	"github.com/ecxfer/ecxfer/xfer"
)

// A READ queued (async) to a peer removed before its post says so.
func TestReadOfAPeerRemovedBeforePostSaysSo(t *testing.T) {
	c, _ := newAgent(t, variants[0], 8, 64, Config{})
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	c.cmu.Lock()
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		c.cmu.Unlock()
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	if err == nil {
		err = c.RemoveRemotePeer(peer.Agent)
	}
	c.cmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Failed || !errors.Is(c.failedWhy(h), xfer.ErrUnknownPeer) {
		t.Errorf("a READ of a removed peer: %v, saying %v", pg, c.failedWhy(h))
	}
	c.Release(h)
}
