package transport

import (
	"errors"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// A READ whose writer is dialing a producer that does not answer (SYNs
// dropped), when its peer is removed, fails for the removal, and says so.
func TestReadOfAPeerRemovedWhileDialingSaysSo(t *testing.T) {
	addr := silentAddr(t)
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{DialTimeout: time.Minute})
	peer, err := c.AddRemotePeer(agentMetaBytes(t, "blackhole", addr, 64, 8, metaVersion), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{0}, peer.Agent, []int{1}, []byte("a:b"))
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	links := c.peers[peer.Agent].links
	c.mu.Unlock()
	dialing := func() bool {
		for _, l := range links {
			if !l.dial.TryLock() {
				return true
			}
			l.dial.Unlock()
		}
		return false
	}
	for end := time.Now().Add(5 * time.Second); !dialing(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Skip("no dial stayed under way")
		}
	}
	if err := c.RemoveRemotePeer(peer.Agent); err != nil {
		t.Fatal(err)
	}
	if p := waitEnd(t, c, h); p != xfer.Failed {
		t.Fatalf("READ: %v", p)
	}
	why := tcpPlane{c}.FailedWhy(h)
	if !errors.Is(why, errStopped) {
		t.Errorf("the READ failed because its peer was removed; its why says: %v", why)
	}
}

// READs ended by every racing party at once (Releases of their
// neighbours breaking the connection, the peer's removal, the producer's
// answers) each say why if and only if Failed (saysWhy in waitEnd).
func TestEveryFailedReadSaysWhy(t *testing.T) {
	cr, pr := newRegion(t, 64, 4096), newRegion(t, 64, 4096)
	c := newTCP(t, cr, TCPConfig{Conns: 2, IOTimeout: time.Second})
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	for round := range 60 {
		peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var hs []xfer.Handle
		for i := range 16 {
			h, err := c.PostRead([]int{i, i + 16}, peer.Agent, []int{i, i + 32}, []byte("s:m"))
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := round % 3; i < len(hs); i += 3 {
				c.Release(hs[i])
			}
		}()
		if round%2 == 0 {
			c.RemoveRemotePeer(peer.Agent)
		}
		<-done
		for i, h := range hs {
			if i%3 == round%3 {
				continue
			}
			waitEnd(t, c, h)
			c.Release(h)
		}
		if round%2 != 0 {
			c.RemoveRemotePeer(peer.Agent)
		}
	}
}
