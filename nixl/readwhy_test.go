//go:build nixlfake

package nixl

import (
	"errors"
	"testing"

	"github.com/ecxfer/ecxfer/xfer"
)

// A READ queued behind a peer load that fails ends Failed, and says why:
// the load's failure, not a NIXL post refusal that never happened.
func TestReadBehindAFailedLoadSaysWhy(t *testing.T) {
	c, _ := newAgent(t, variants[0], 8, 64, Config{})
	p, _ := newAgent(t, variants[0], 8, 64, Config{})
	c.cmu.Lock()
	fakeFail(fakeLoad, -10, 1)
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		c.cmu.Unlock()
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	c.cmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Failed {
		t.Fatalf("READ behind a failed load: %v", pg)
	}
	why := c.failedWhy(h)
	if !errors.Is(why, errRemoteDisconnect) {
		t.Errorf("why names %v, not the failed load (remote disconnected)", why)
	}
	c.Release(h)
}

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
	if pg := waitEnded(t, c, h); pg == xfer.Failed && !errors.Is(c.failedWhy(h), xfer.ErrUnknownPeer) {
		t.Errorf("a READ of a removed peer failed, saying %v", c.failedWhy(h))
	}
	c.Release(h)
}
