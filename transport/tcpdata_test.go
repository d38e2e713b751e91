package transport

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/xfer"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newRegion(t testing.TB, blocks, size int) *cache.Region {
	t.Helper()
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: size, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func newSharedRegion(t testing.TB, blocks, size int) *cache.Region {
	t.Helper()
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: blocks, BlockSize: size, NoLock: true, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func newTCP(t testing.TB, region *cache.Region, cfg TCPConfig) *TCPData {
	t.Helper()
	cfg.Logger = quiet
	d, err := NewTCPData(cfg, region)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func allowAll(string, []byte, []int) (func(), bool) { return func() {}, true }

func TestTCPConformance(t *testing.T) {
	xfertest.Conformance(t, func(t *testing.T) xfertest.Pair {
		cr, pr := newRegion(t, 128, 4096), newRegion(t, 128, 4096)
		c := newTCP(t, cr, TCPConfig{Name: "consumer"})
		p := newTCP(t, pr, TCPConfig{Name: "producer", Listen: "127.0.0.1:0", Authorize: allowAll})
		return xfertest.Pair{Consumer: c, Producer: p, ConsumerBlock: cr.Block, ProducerBlock: pr.Block, Blocks: 128}
	})
}

func waitEnd(t testing.TB, d xfer.DataTransport, h xfer.Handle) xfer.Progress {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
		p, err := d.Check(h)
		if err != nil {
			t.Fatal(err)
		}
		if p != xfer.InProgress {
			saysWhy(t, d, h, p)
			return p
		}
	}
	t.Fatal("READ did not end")
	return 0
}

// saysWhy checks the rule that every READ this plane fails says why
// (plane.Explainer), whatever failed it.
func saysWhy(t testing.TB, d xfer.DataTransport, h xfer.Handle, p xfer.Progress) {
	t.Helper()
	td, ok := d.(*TCPData)
	if !ok {
		return
	}
	why := tcpPlane{td}.FailedWhy(h)
	switch {
	case p == xfer.Failed && why == nil:
		t.Errorf("READ %d failed, and the plane does not say why", h)
	case p != xfer.Failed && why != nil:
		t.Errorf("READ %d is %v, yet the plane says why it failed: %v", h, p, why)
	}
}

// The producer serves only what its gates grant; a refusal is a failed
// READ on the consumer and no notification on the producer. With no gate
// at all nothing is served.
func TestTCPAuthorize(t *testing.T) {
	cr, pr := newRegion(t, 8, 64), newRegion(t, 8, 64)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: func(_ string, n []byte, b []int) (func(), bool) {
		return func() {}, string(n) == "s:ok" && len(b) == 1 && b[0] == 2
	}})
	c := newTCP(t, cr, TCPConfig{})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	copy(pr.Block(2), "granted")
	copy(pr.Block(3), "secret")
	bad, _ := c.PostRead([]int{0}, peer.Agent, []int{3}, []byte("s:ok"))
	good, _ := c.PostRead([]int{1}, peer.Agent, []int{2}, []byte("s:ok"))
	other, _ := c.PostRead([]int{2}, peer.Agent, []int{2}, []byte("s:other"))
	if waitEnd(t, c, bad) != xfer.Failed || waitEnd(t, c, other) != xfer.Failed || waitEnd(t, c, good) != xfer.Complete {
		t.Fatal("the authorizer was not obeyed")
	}
	if bytes.Contains(cr.Bytes(), []byte("secret")) || !bytes.HasPrefix(cr.Block(1), []byte("granted")) {
		t.Fatal("bytes")
	}
	n := waitNotifs(t, p, 1)
	time.Sleep(20 * time.Millisecond)
	n, _ = p.DrainNotifs(n)
	if len(n) != 1 || string(n[0].Msg) != "s:ok" {
		t.Fatalf("notifs %+v", n)
	}
	// Without a gate nothing is served.
	p2 := newTCP(t, newRegion(t, 8, 64), TCPConfig{Listen: "127.0.0.1:0"})
	peer2, _ := c.AddRemotePeer(p2.AgentMetadata(), nil)
	h, _ := c.PostRead([]int{4}, peer2.Agent, []int{0}, []byte("s:ok"))
	if waitEnd(t, c, h) != xfer.Failed {
		t.Fatal("served without a gate")
	}
}

// waitNotifs drains p until it has n notifications, or fails after 5 s.
func waitNotifs(t testing.TB, p *TCPData, n int) []xfer.Notif {
	t.Helper()
	var got []xfer.Notif
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n {
		got, _ = p.DrainNotifs(got)
		if time.Now().After(deadline) {
			t.Fatalf("%d notifications of %d", len(got), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return got
}

func TestTCPMetadata(t *testing.T) {
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{})
	p := newTCP(t, newRegion(t, 8, 128), TCPConfig{Listen: "127.0.0.1:0"})
	if _, err := c.AddRemotePeer(p.AgentMetadata(), nil); !errors.Is(err, errBadMeta) {
		t.Fatalf("block size mismatch: %v", err)
	}
	p2 := newTCP(t, newRegion(t, 8, 128), TCPConfig{Listen: "127.0.0.1:0"})
	if bytes.Equal(p.AgentMetadata(), p2.AgentMetadata()) {
		t.Fatal("two incarnations share metadata")
	}
	for _, m := range [][]byte{nil, {0xc1}, {0x80}, []byte("\x81\xa1v\x02"), agentMetaBytes(t, "old", "127.0.0.1:1", 64, 8, 1)} {
		if _, err := c.AddRemotePeer(m, nil); !errors.Is(err, errBadMeta) {
			t.Fatalf("%x: %v", m, err)
		}
	}
	// The descriptor is a valid, empty list: acks stay small whatever the
	// region's size, and the consumer needs only the metadata.
	if !bytes.Equal(p.MemDescriptor(), []byte{0x90}) {
		t.Fatalf("descriptor %x", p.MemDescriptor())
	}
}

// A restarted producer (new incarnation, same name) replaces the old
// registration; READs go to the new one.
func TestTCPProducerRestart(t *testing.T) {
	cr := newRegion(t, 8, 64)
	c := newTCP(t, cr, TCPConfig{})
	pr := newRegion(t, 8, 64)
	p1 := newTCP(t, pr, TCPConfig{Name: "prod", Listen: "127.0.0.1:0", Authorize: allowAll})
	if _, err := c.AddRemotePeer(p1.AgentMetadata(), nil); err != nil {
		t.Fatal(err)
	}
	p1.Close()
	p2 := newTCP(t, pr, TCPConfig{Name: "prod", Listen: "127.0.0.1:0", Authorize: allowAll})
	copy(pr.Block(1), "second life")
	peer, err := c.AddRemotePeer(p2.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := c.PostRead([]int{0}, peer.Agent, []int{1}, []byte("a:b"))
	if waitEnd(t, c, h) != xfer.Complete || !bytes.HasPrefix(cr.Block(0), []byte("second life")) {
		t.Fatal("READ did not reach the restarted producer")
	}
}

// Two live producers configured with one name are two peers: each READ
// reaches the producer whose ack it follows.
func TestTCPProducersSharingAName(t *testing.T) {
	cr := newRegion(t, 8, 64)
	c := newTCP(t, cr, TCPConfig{})
	pr1, pr2 := newRegion(t, 8, 64), newRegion(t, 8, 64)
	copy(pr1.Block(1), "first")
	copy(pr2.Block(1), "second")
	p1 := newTCP(t, pr1, TCPConfig{Name: "demo-producer", Listen: "127.0.0.1:0", Authorize: allowAll})
	p2 := newTCP(t, pr2, TCPConfig{Name: "demo-producer", Listen: "127.0.0.1:0", Authorize: allowAll})
	peer1, err := c.AddRemotePeer(p1.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	peer2, err := c.AddRemotePeer(p2.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if peer1.Agent == peer2.Agent {
		t.Fatal("two producers merged into one peer")
	}
	h1, _ := c.PostRead([]int{0}, peer1.Agent, []int{1}, []byte("a:b"))
	h2, _ := c.PostRead([]int{2}, peer2.Agent, []int{1}, []byte("a:b"))
	if waitEnd(t, c, h1) != xfer.Complete || waitEnd(t, c, h2) != xfer.Complete {
		t.Fatal("READs failed")
	}
	if !bytes.HasPrefix(cr.Block(0), []byte("first")) || !bytes.HasPrefix(cr.Block(2), []byte("second")) {
		t.Fatalf("READs reached the wrong producer: %q %q", cr.Block(0)[:6], cr.Block(2)[:6])
	}
	// Removing one leaves the other registered.
	if err := c.RemoveRemotePeer(peer1.Agent); err != nil {
		t.Fatal(err)
	}
	h3, _ := c.PostRead([]int{3}, peer2.Agent, []int{1}, []byte("a:b"))
	if waitEnd(t, c, h3) != xfer.Complete {
		t.Fatal("the other producer was dropped")
	}
}

// Hostile input on the data port closes that connection only.
func TestTCPHostileDataPort(t *testing.T) {
	pr := newRegion(t, 8, 64)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll, IOTimeout: 200 * time.Millisecond})
	addr := p.Addr().String()
	hello := appendHello(nil, "evil", 0, nil)
	cases := map[string][]byte{
		"wrong magic":        []byte("HTTP/1.1 GET /\r\n\r\n"),
		"old version":        append([]byte("ECX1"), frameHello, 0, 1, 'x'),
		"read before hello":  appendRead(nil, 1, nil, 1, spans(nil, []int{0}), false),
		"oversize name":      append(appendHead(nil, frameHello), 0xff, 0xff),
		"oversize notif":     append(hello, append(appendHead(nil, frameRead), 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0, 1)...),
		"too many blocks":    append(hello, append(appendHead(nil, frameRead), 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff)...),
		"block out of range": append(hello, appendRead(nil, 1, []byte("a:b"), 1, spans(nil, []int{8}), false)...),
		"unknown frame":      append(hello, appendHead(nil, 99)...),
		"a data frame":       append(hello, appendDataHead(nil, 1, dataOK, 64)...),
		"stall mid-frame":    append(hello, frameMagic[:2]...),
		"stall in the hello": appendHead(nil, frameHello),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(in)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = io.Copy(io.Discard, c) // the welcome, if the hello was one
			if errTimeout(err) != nil {
				t.Fatal("connection not closed within 5 s")
			}
		})
	}
	// The producer still serves an honest consumer.
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{})
	peer, _ := c.AddRemotePeer(p.AgentMetadata(), nil)
	h, _ := c.PostRead([]int{0}, peer.Agent, []int{7}, []byte("a:b"))
	if waitEnd(t, c, h) != xfer.Complete {
		t.Fatal("honest consumer not served")
	}
}

// errTimeout returns err when it is a timeout, else nil.
func errTimeout(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return nil
}

// A producer that stops answering fails the READs in flight within the I/O
// timeout; it does not hold them forever.
func TestTCPStalledProducer(t *testing.T) {
	ln := silentListener(t)
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{IOTimeout: 100 * time.Millisecond})
	m := agentMetaBytes(t, "stalled", ln.Addr().String(), 64, 8, metaVersion)
	peer, err := c.AddRemotePeer(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := c.PostRead([]int{0}, peer.Agent, []int{1}, []byte("a:b"))
	if waitEnd(t, c, h) != xfer.Failed {
		t.Fatal("READ from a stalled producer did not fail")
	}
}

func agentMetaBytes(t testing.TB, name, addr string, bs, n, version int) []byte {
	t.Helper()
	b, err := msgpack.Marshal(&agentMeta{Version: version, Name: name, Addr: addr, Incarnation: "x", BlockSize: bs, Blocks: n})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Whatever a producer puts in its agent metadata, registering it fails
// cleanly or yields a usable peer; it never panics.
func FuzzTCPAddRemotePeer(f *testing.F) {
	good := agentMetaBytes(f, "p", "127.0.0.1:1", 64, 8, metaVersion)
	f.Add(good)
	f.Add([]byte{0x91, 0x91, 0x91, 0x91})
	f.Add(bytes.Repeat([]byte{0x91}, 4000))
	f.Add([]byte("\x86\xa1\xffM\xc6yCUam!\x95\xbc")) // claims a 2 GB bin: took gigabytes to decode
	r := newRegion(f, 8, 64)
	d := newTCP(f, r, TCPConfig{})
	f.Fuzz(func(t *testing.T, meta []byte) {
		p, err := d.AddRemotePeer(meta, nil)
		if err != nil {
			return
		}
		if p.Agent == "" || p.Blocks <= 0 {
			t.Fatalf("bad peer %+v", p)
		}
		if err := d.RemoveRemotePeer(p.Agent); err != nil {
			t.Fatal(err)
		}
	})
}

// READs to a producer that stops answering cannot pile up: past MaxQueued
// in flight, PostRead refuses; when they fail, the room comes back.
func TestTCPInFlightBound(t *testing.T) {
	ln := silentListener(t)
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{MaxQueued: 5, IOTimeout: 200 * time.Millisecond})
	peer, err := c.AddRemotePeer(agentMetaBytes(t, "stalled", ln.Addr().String(), 64, 8, metaVersion), nil)
	if err != nil {
		t.Fatal(err)
	}
	var hs []xfer.Handle
	for range 5 {
		h, err := c.PostRead([]int{0}, peer.Agent, []int{1}, []byte("a:b"))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, nil); !errors.Is(err, errBusy) {
		t.Fatalf("sixth READ: %v", err)
	}
	for _, h := range hs {
		if waitEnd(t, c, h) != xfer.Failed {
			t.Fatal("READ from a stalled producer did not fail")
		}
		c.Release(h)
	}
	if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, nil); err != nil {
		t.Fatalf("after the failures: %v", err)
	}
}

// silentListener accepts connections and never reads from or answers them:
// a producer that stopped. They are closed when the test ends.
func silentListener(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return ln
}

// A write deadline left on a connection by a blocking write (each READ's
// done frame) must not fail a later READ written without waiting.
func TestTCPIdleAfterDeadline(t *testing.T) {
	cr, pr := newRegion(t, 8, 4096), newRegion(t, 8, 4096)
	pr.Block(3)[0] = 7
	c := newTCP(t, cr, TCPConfig{IOTimeout: 100 * time.Millisecond})
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	peer, _ := c.AddRemotePeer(p.AgentMetadata(), nil)
	for i := range 3 {
		h, _ := c.PostRead([]int{0}, peer.Agent, []int{3}, []byte("s:m"))
		if got := waitEnd(t, c, h); got != xfer.Complete || cr.Block(0)[0] != 7 {
			t.Fatalf("READ %d: %v", i, got)
		}
		c.Release(h)
		time.Sleep(150 * time.Millisecond) // past the last deadline: the condition itself
	}
}

// A consumer that sends a READ id it already has in flight is cut off,
// and every hold the producer took for it is released: reusing an id must
// not make a notification ambiguous.
func TestDuplicateReadIDReleasesHolds(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{IOTimeout: 5 * time.Second})
	a, b := g.grant(2), g.grant(3)
	conn, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write(appendHello(nil, "raw", 0, nil))
	conn.Write(appendRead(nil, 7, a, 1, spans(nil, []int{2}), false))
	conn.Write(appendRead(nil, 7, b, 1, spans(nil, []int{3}), false))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("the connection was not closed: %v", err)
	}
	until(t, "every hold is released", func() bool { return g.held.Load() == 0 })
	if n, _ := p.DrainNotifs(nil); len(n) != 0 {
		t.Fatalf("notifications %v", n)
	}
}

// until polls cond (an event on another goroutine, not a time) for 10 s.
func until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	untilEvery(t, 50*time.Microsecond, what, cond)
}

// untilEvery is until, polling every pace.
func untilEvery(t testing.TB, pace time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(pace) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// A READ's ids are kept as runs; runs that break at different places on
// the two sides land every block where it belongs, over TCP and out of a
// same-host producer's region, small and large.
func TestScatteredRuns(t *testing.T) {
	const bs = 4096
	n := 2*parallelCopyMin/bs + 7
	for _, tc := range []struct {
		name     string
		noShared bool
		blocks   int
	}{{"tcp", true, 6}, {"shm", false, 6}, {"tcp-large", true, n}, {"shm-large", false, n}} {
		t.Run(tc.name, func(t *testing.T) {
			pr, cr := newSharedRegion(t, 2*n, bs), newRegion(t, 2*n, bs)
			for b := range 2 * n {
				for i := range pr.Block(b) {
					pr.Block(b)[i] = byte(b*7 + i)
				}
			}
			c := newTCP(t, cr, TCPConfig{NoSharedMemory: tc.noShared})
			p, g := gatedProducer(t, pr, TCPConfig{})
			peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
			if err != nil {
				t.Fatal(err)
			}
			warm(t, c, peer.Agent, g)
			// local: descending pairs and gaps; remote: runs of three.
			var local, remote []int
			for i := range tc.blocks {
				local = append(local, (i/2)*5%(2*n)+i%2)
				remote = append(remote, (i/3)*4+i%3)
			}
			seen := map[int]bool{}
			for i, b := range local {
				for seen[b] {
					b = (b + 1) % (2 * n)
				}
				seen[b], local[i] = true, b
			}
			copies := c.Stats().BoardCopies
			h, err := c.PostRead(local, peer.Agent, remote, g.grant(remote...))
			if err != nil {
				t.Fatal(err)
			}
			if got := waitEnd(t, c, h); got != xfer.Complete {
				t.Fatalf("READ: %v", got)
			}
			for i := range local {
				if !bytes.Equal(cr.Block(local[i]), pr.Block(remote[i])) {
					t.Fatalf("local %d does not hold remote %d", local[i], remote[i])
				}
			}
			if copied := c.Stats().BoardCopies > copies; copied == tc.noShared {
				t.Fatalf("copied out of the shared region: %v", copied)
			}
		})
	}
}

// warm brings a consumer's connections to a producer up with READs of
// block 0 (on a same-host producer, its welcome proves the region).
func warm(t testing.TB, c *TCPData, agent string, g *testGate) {
	t.Helper()
	for range 3 {
		h, err := c.PostRead([]int{0}, agent, []int{0}, g.grant(0))
		if err != nil {
			t.Fatal(err)
		}
		if waitEnd(t, c, h) != xfer.Complete {
			t.Fatal("warm-up READ failed")
		}
		c.Release(h)
	}
}

// A data plane maps a producer's region once, for all its registrations
// of that producer, and unmaps it with the last; another data plane in the
// process maps its own (nothing couples two of them).
func TestSharedMappingPerDataPlane(t *testing.T) {
	borrowOwn = false // a region of another process, as far as mapping goes
	defer func() { borrowOwn = true }()
	pr := newSharedRegion(t, 8, 4096)
	p, _ := gatedProducer(t, pr, TCPConfig{})
	mapping := func(c *TCPData, agent string) *byte {
		c.mu.Lock()
		defer c.mu.Unlock()
		return unsafe.SliceData(c.peers[agent].sh.mem)
	}
	c1, c2 := newTCP(t, newRegion(t, 8, 4096), TCPConfig{}), newTCP(t, newRegion(t, 8, 4096), TCPConfig{})
	a1, _ := c1.AddRemotePeer(p.AgentMetadata(), nil)
	a2, _ := c2.AddRemotePeer(p.AgentMetadata(), nil)
	if mapping(c1, a1.Agent) == mapping(c2, a2.Agent) {
		t.Fatal("two data planes share a mapping")
	}
	if n := len(c1.maps); n != 1 {
		t.Fatalf("%d mappings", n)
	}
	c1.RemoveRemotePeer(a1.Agent)
	until(t, "the mapping goes with the last registration", func() bool {
		c1.mu.Lock()
		defer c1.mu.Unlock()
		return len(c1.maps) == 0
	})
}

// The rule for a producer's agent metadata: what decoding it allocates is
// bounded by its size, whatever lengths and counts it claims. Each
// length-bearing msgpack type, claiming up to 4 GiB, in place of each value
// of a real blob, and after a key no field has.
func TestAgentMetaClaimsBounded(t *testing.T) {
	good := agentMetaBytes(t, "p", "127.0.0.1:1", 64, 8, metaVersion)
	claims := [][]byte{
		{0xc4, 0xff}, {0xc5, 0xff, 0xff}, {0xc6, 0x79, 0x43, 0x55, 0x61}, {0xc6, 0xff, 0xff, 0xff, 0xff}, // bin
		{0xd9, 0xff}, {0xda, 0xff, 0xff}, {0xdb, 0x7f, 0xff, 0xff, 0xff}, // str
		{0xc7, 0xff, 1}, {0xc8, 0xff, 0xff, 1}, {0xc9, 0x7f, 0xff, 0xff, 0xff, 1}, // ext
		{0xdc, 0xff, 0xff}, {0xdd, 0x0f, 0xff, 0xff, 0xff}, {0xdd, 0x00, 0x0f, 0xff, 0xff}, // array
		{0xde, 0xff, 0xff}, {0xdf, 0x0f, 0xff, 0xff, 0xff}, // map
	}
	var blobs [][]byte
	for _, c := range claims {
		blobs = append(blobs, c, append([]byte{0x81, 0xa1, 0xff}, c...), append([]byte{0x86, 0xa1, 0xff}, c...))
		for i := 1; i < len(good); i++ { // the claim spliced in after each byte
			blobs = append(blobs, append(append(slices.Clone(good[:i]), c...), good[i:]...))
		}
	}
	r := newRegion(t, 8, 64)
	d := newTCP(t, r, TCPConfig{})
	var ms runtime.MemStats
	for _, b := range blobs {
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		if p, err := d.AddRemotePeer(b, nil); err == nil {
			d.RemoveRemotePeer(p.Agent)
		}
		runtime.ReadMemStats(&ms)
		if got := ms.TotalAlloc - before; got > 1<<20 {
			t.Fatalf("metadata of %d bytes (% x...) took %d bytes to decode", len(b), b[:min(len(b), 16)], got)
		}
	}
}

// The check the metadata passes first takes every value the encoder of
// agent metadata writes, whole, and nothing cut short or followed by more.
func TestMetaCheckTakesEncodedValues(t *testing.T) {
	values := []any{nil, true, 1, -1, 200, -200, 70000, -70000, 1 << 40, -(1 << 40), uint64(1 << 63), 1.5, float32(2.5),
		"", "x", strings.Repeat("s", 40), strings.Repeat("s", 300), strings.Repeat("s", 70000),
		[]byte{}, []byte("b"), bytes.Repeat([]byte("b"), 300), bytes.Repeat([]byte("b"), 70000),
		[]int{}, []int{1, 2, 3}, make([]int, 20), make([]int, 70000), map[string]int{}, map[string]any{"a": []any{1, "x", map[string]int{"b": 2}}},
		time.Unix(1, 2), time.Unix(1<<34, 2)}
	for _, v := range values {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := wireview.Whole(b); err != nil {
			t.Errorf("%T (% x...): %v", v, b[:min(len(b), 8)], err)
		}
		for _, bad := range [][]byte{b[:len(b)-1], append(slices.Clone(b), 0)} {
			if wireview.Whole(bad) == nil {
				t.Errorf("%T: % x taken", v, bad[:min(len(bad), 8)])
			}
		}
	}
	for _, e := range [][]byte{{0xd4, 1, 2}, {0xd5, 1, 2, 3}, {0xd6, 1, 0, 0, 0, 0}, {0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0}, append([]byte{0xd8, 1}, make([]byte, 16)...)} {
		if err := wireview.Whole(e); err != nil {
			t.Errorf("fixext % x: %v", e, err)
		}
		if wireview.Whole(e[:len(e)-1]) == nil {
			t.Errorf("fixext cut short taken: % x", e)
		}
	}
	if wireview.Whole([]byte{0xc1}) == nil {
		t.Error("0xc1 taken")
	}
}
