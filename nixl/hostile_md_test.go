//go:build nixl

package nixl

import (
	"bytes"
	"fmt"
	"math/rand"
	"runtime"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A producer's agent metadata reaches NIXL's loadRemoteMD as the producer
// sent it. Whatever it is (cut short, bytes changed, in its UCX address
// too, random, or naming the consumer itself), registering it fails with
// an error or succeeds, and never crashes the process; the agent then
// registers and READs from another producer as before.
func TestHostileMetadata(t *testing.T) {
	v := variants[0]
	v.env(t)
	p, pr := newAgent(t, v, 4, 4096, Config{})
	c, cr := newAgent(t, v, 4, 4096, Config{SyncPost: true}) // each load in the call
	md := p.AgentMetadata()
	desc := regionDesc(pr)
	rng := rand.New(rand.NewSource(1))
	tries, refused := 0, 0
	try := func(m []byte) error {
		tries++
		peer, err := c.AddRemotePeer(m, desc)
		if err != nil {
			refused++
			return err
		}
		if err := c.RemoveRemotePeer(peer.Agent); err != nil {
			t.Fatalf("removing a registration: %v", err)
		}
		return nil
	}
	for n := 0; n < len(md); n += max(1, len(md)/100) {
		try(md[:n])
	}
	mutate := func(from, n int) []byte {
		m := bytes.Clone(md)
		for range 1 + rng.Intn(3) {
			m[from+rng.Intn(n)] = byte(rng.Intn(256))
		}
		return m
	}
	for range 200 {
		try(mutate(0, len(md)))
	}
	if at := bytes.Index(md, []byte("|cM")); at >= 0 { // the UCX worker address
		for range 300 {
			try(mutate(at+3, min(140, len(md)-at-3)))
		}
	}
	for range 100 {
		m := make([]byte, 1+rng.Intn(400))
		rng.Read(m)
		try(m)
	}
	if err := try(bytes.Replace(md, []byte(p.cfg.Name), []byte(c.cfg.Name), 1)); err == nil {
		t.Error("metadata naming the consumer itself was registered")
	}
	t.Logf("%d registrations tried, %d refused", tries, refused)
	if refused == 0 {
		t.Fatal("nothing refused: the mutations did not reach NIXL")
	}
	q, qr := newAgent(t, v, 4, 4096, Config{})
	readFrom(t, c, cr, q.AgentMetadata(), qr)
}

// Metadata naming a producer registered already, from other metadata,
// is refused before NIXL sees it: NIXL would replace the producer's
// blocks, or, the rest failing to load, drop the producer. The producer
// registered first is READ from as before.
func TestRegisteredPeerNotReplaced(t *testing.T) {
	v := variants[0]
	v.env(t)
	p, pr := newAgent(t, v, 4, 4096, fixedName())
	c, cr := newAgent(t, v, 4, 4096, Config{SyncPost: true})
	for _, async := range []bool{false, true} {
		if async {
			c, cr = newAgent(t, v, 4, 4096, Config{})
		}
		md := p.AgentMetadata()
		peer, err := c.AddRemotePeer(md, regionDesc(pr))
		if err != nil {
			t.Fatal(err)
		}
		q, _ := newAgent(t, v, 4, 4096, fixedName())
		impostor := renamed(t, q.AgentMetadata(), q.cfg.Name, p.cfg.Name)
		for name, m := range map[string][]byte{
			"cut short":            md[:len(md)-20],
			"another's, renamed":   impostor,
			"another's, cut short": impostor[:bytes.Index(impostor, []byte("MemSection"))],
		} {
			if _, err := c.AddRemotePeer(m, regionDesc(pr)); err == nil {
				t.Errorf("async %v: %s metadata naming a registered producer was registered", async, name)
			}
		}
		readPeer(t, c, cr, peer, pr)
		if err := c.RemoveRemotePeer(peer.Agent); err != nil {
			t.Fatal(err)
		}
	}
}

// A load that fails after NIXL took the connection it names keeps that
// connection under the agent's name, and a later load of the real agent
// would be refused for a connection that changed: the failed load's is
// dropped at once.
func TestFailedLoadLeavesNoConnection(t *testing.T) {
	v := variants[0]
	v.env(t)
	p, pr := newAgent(t, v, 4, 4096, fixedName())
	q, _ := newAgent(t, v, 4, 4096, fixedName())
	for _, async := range []bool{false, true} {
		c, cr := newAgent(t, v, 4, 4096, Config{SyncPost: !async})
		impostor := renamed(t, q.AgentMetadata(), q.cfg.Name, p.cfg.Name)
		cut := impostor[:bytes.Index(impostor, []byte("MemSection"))] // the connection, no memory section
		if peer, err := c.AddRemotePeer(cut, regionDesc(pr)); err == nil {
			if async {
				settle(t, c) // the load runs, and fails, in the progress goroutine
			}
			c.RemoveRemotePeer(peer.Agent)
		}
		readFrom(t, c, cr, p.AgentMetadata(), pr)
	}
}

// fixedName is a config whose agent name is as long as every other
// fixedName's, so that renamed can swap them.
func fixedName() Config { return Config{Name: fmt.Sprintf("fixed-%06d", seq.Add(1))} }

// renamed is metadata md with its agent name old replaced by name, of the
// same length.
func renamed(t *testing.T, md []byte, old, name string) []byte {
	t.Helper()
	if len(old) != len(name) || !bytes.Contains(md, []byte(old)) {
		t.Fatalf("cannot rename %q to %q", old, name)
	}
	return bytes.Replace(md, []byte(old), []byte(name), 1)
}

func regionDesc(r *cache.Region) []byte {
	return wire.AppendBlockDescs(nil, uint64(r.Base()), uint64(r.BlockSize()), r.Blocks(), 0)
}

// readFrom registers the producer of md over region pr with c, READs its
// block 2 into c's block 0 and checks the bytes.
func readFrom(t *testing.T, c *Agent, cr *cache.Region, md []byte, pr *cache.Region) {
	t.Helper()
	peer, err := c.AddRemotePeer(md, regionDesc(pr))
	if err != nil {
		t.Fatalf("registering an honest producer: %v", err)
	}
	readPeer(t, c, cr, peer, pr)
	if err := c.RemoveRemotePeer(peer.Agent); err != nil {
		t.Fatal(err)
	}
}

func readPeer(t *testing.T, c *Agent, cr *cache.Region, peer xfer.Peer, pr *cache.Region) {
	t.Helper()
	xfertestFill(pr.Block(2), byte(len(peer.Agent)))
	clear(cr.Block(0))
	h, err := c.PostRead([]int{0}, peer.Agent, []int{2}, []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	if pg := waitEnded(t, c, h); pg != xfer.Complete {
		t.Fatalf("READ from an honest producer: %v", pg)
	}
	c.Release(h)
	if !bytes.Equal(cr.Block(0), pr.Block(2)) {
		t.Fatal("READ from an honest producer: wrong bytes")
	}
}

// A registered producer's metadata travels in every ack, so another
// producer can send it with blocks of its own choosing. That registration
// is refused while the first holds the name: cnixl keeps one set of
// blocks per agent name, and loading the second would point the first
// one's READs at other blocks, or, failing to prepare them, drop the
// producer. The first producer's READs land the blocks they name.
func TestForeignDescriptorIsRefused(t *testing.T) {
	v := variants[0]
	v.env(t)
	const bs = 4096
	p, pr := newAgent(t, v, 4, bs, Config{})
	for _, async := range []bool{false, true} {
		c, cr := newAgent(t, v, 4, bs, Config{SyncPost: !async})
		md := p.AgentMetadata()
		peer, err := c.AddRemotePeer(md, regionDesc(pr))
		if err != nil {
			t.Fatal(err)
		}
		if async {
			settle(t, c)
		}
		for name, desc := range map[string][]byte{
			"shifted": wire.AppendBlockDescs(nil, uint64(pr.Base())+bs, bs, 3, 0),
			"unregistered": wire.AppendMemDescs(nil, []wire.MemDesc{
				{Addr: wire.IntOf(4096), Size: wire.IntOf(bs), Device: wire.IntOf(0)},
				{Addr: wire.IntOf(1 << 20), Size: wire.IntOf(100), Device: wire.IntOf(0)},
			}),
		} {
			if _, err := c.AddRemotePeer(md, desc); err == nil {
				t.Errorf("async %v: the registered producer's metadata with %s blocks was registered", async, name)
			}
			if async {
				settle(t, c)
			}
			readPeer(t, c, cr, peer, pr)
		}
	}
}

// A registration removed while its load is under way keeps its claim on
// the name until the load is undone: until then metadata naming that
// agent is refused, and once registered it loads (NIXL would refuse a
// load of the name while the other's connection is still there).
func TestClaimHeldUntilLoadUndone(t *testing.T) {
	v := variants[0]
	v.env(t)
	const bs = 4096
	p, pr := newAgent(t, v, 4, bs, fixedName())
	q, qr := newAgent(t, v, 4, bs, fixedName())
	impostor := renamed(t, q.AgentMetadata(), q.cfg.Name, p.cfg.Name)
	for try := range 20 {
		c, cr := newAgent(t, v, 4, bs, Config{})
		kb, err := c.AddRemotePeer(impostor, regionDesc(qr))
		if err != nil {
			t.Fatal(err)
		}
		for { // the progress goroutine took the load
			c.mu.Lock()
			n := len(c.peerOps)
			c.mu.Unlock()
			if n == 0 {
				break
			}
			runtime.Gosched()
		}
		time.Sleep(time.Duration(try*20) * time.Microsecond) // into loadRemoteMD, on some tries
		if err := c.RemoveRemotePeer(kb.Agent); err != nil {
			t.Fatal(err)
		}
		if ka, err := c.AddRemotePeer(p.AgentMetadata(), regionDesc(pr)); err == nil {
			settle(t, c)
			c.mu.Lock()
			failed := c.peers[ka.Agent].failed
			c.mu.Unlock()
			if failed != nil {
				t.Fatalf("try %d: the honest producer's load failed: %v", try, failed)
			}
			c.RemoveRemotePeer(ka.Agent)
		}
		settle(t, c)
		readFrom(t, c, cr, p.AgentMetadata(), pr)
	}
}

// A peer's notification is bounded: one over CNIXL_MAX_NOTIF is dropped
// (a 2 GiB one crashed the drain, and 4 GiB would break the framing), and
// the next, of a real size, arrives.
func TestLongNotificationDropped(t *testing.T) {
	v := variants[0]
	v.env(t)
	p, _ := newAgent(t, v, 8, 64, Config{Progress: ProgressCaller})
	c, _ := newAgent(t, v, 8, 64, Config{SyncPost: true})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Notify(peer.Agent, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := c.Notify(peer.Agent, []byte("sid:hash")); err != nil {
		t.Fatal(err)
	}
	var got []xfer.Notif
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		c.DrainNotifs(nil) // drives the sender
		got, _ = p.DrainNotifs(got)
		if len(got) > 0 && string(got[len(got)-1].Msg) == "sid:hash" {
			break
		}
	}
	if len(got) != 1 || string(got[0].Msg) != "sid:hash" {
		t.Fatalf("drained %d notifications, want only the short one", len(got))
	}
}
