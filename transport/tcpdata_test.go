package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/wire"
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

func waitEnd(t *testing.T, d xfer.DataTransport, h xfer.Handle) xfer.Progress {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
		p, err := d.Check(h)
		if err != nil {
			t.Fatal(err)
		}
		if p != xfer.InProgress {
			return p
		}
	}
	t.Fatal("READ did not end")
	return 0
}

// The producer serves only what its authorizer grants; a refusal is a
// failed READ on the consumer and no notification on the producer.
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
	var n []xfer.Notif
	for end := time.Now().Add(5 * time.Second); len(n) == 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
		n, _ = p.DrainNotifs(n)
	}
	time.Sleep(20 * time.Millisecond)
	n, _ = p.DrainNotifs(n)
	if len(n) != 1 || string(n[0].Msg) != "s:ok" {
		t.Fatalf("notifs %+v", n)
	}
	// Without an authorizer nothing is served.
	p2 := newTCP(t, newRegion(t, 8, 64), TCPConfig{Listen: "127.0.0.1:0"})
	peer2, _ := c.AddRemotePeer(p2.AgentMetadata(), nil)
	h, _ := c.PostRead([]int{4}, peer2.Agent, []int{0}, []byte("s:ok"))
	if waitEnd(t, c, h) != xfer.Failed {
		t.Fatal("served without an authorizer")
	}
}

func TestTCPMetadata(t *testing.T) {
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{})
	p := newTCP(t, newRegion(t, 8, 128), TCPConfig{Listen: "127.0.0.1:0"})
	if _, err := c.AddRemotePeer(p.AgentMetadata(), nil); !errors.Is(err, ErrBadMeta) {
		t.Fatalf("block size mismatch: %v", err)
	}
	p2 := newTCP(t, newRegion(t, 8, 128), TCPConfig{Listen: "127.0.0.1:0"})
	if bytes.Equal(p.AgentMetadata(), p2.AgentMetadata()) {
		t.Fatal("two incarnations share metadata")
	}
	for _, m := range [][]byte{nil, {0xc1}, {0x80}, []byte("\x81\xa1v\x02")} {
		if _, err := c.AddRemotePeer(m, nil); !errors.Is(err, ErrBadMeta) {
			t.Fatalf("%x: %v", m, err)
		}
	}
	// The descriptor is a valid, empty list: acks stay small whatever the
	// region's size, and the consumer needs only the metadata.
	if descs, err := wire.DecodeMemDescs(p.MemDescriptor()); err != nil || len(descs) != 0 {
		t.Fatalf("descriptor %x: %d descriptors, %v", p.MemDescriptor(), len(descs), err)
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

// Issue 13 item 2: two live producers configured with one name are two
// peers: each READ reaches the producer whose ack it follows.
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
	hello := appendHello(nil, "evil")
	cases := map[string][]byte{
		"wrong magic":        []byte("HTTP/1.1 GET /\r\n\r\n"),
		"read before hello":  appendRead(nil, 1, nil, 1, spans(nil, []int{0}), false),
		"oversize name":      append(appendHead(nil, frameHello), 0xff, 0xff),
		"oversize notif":     append(hello, append(appendHead(nil, frameRead), 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0, 1)...),
		"too many blocks":    append(hello, append(appendHead(nil, frameRead), 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff)...),
		"block out of range": append(hello, appendRead(nil, 1, []byte("a:b"), 1, spans(nil, []int{8}), false)...),
		"unknown frame":      append(hello, appendHead(nil, 99)...),
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
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			if err == nil {
				t.Fatalf("connection still open; read %q", buf[:n])
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
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

// A producer that stops answering fails the READs in flight within the I/O
// timeout; it does not hold them forever.
func TestTCPStalledProducer(t *testing.T) {
	ln := silentListener(t)
	c := newTCP(t, newRegion(t, 8, 64), TCPConfig{IOTimeout: 100 * time.Millisecond})
	m := agentMetaBytes(t, "stalled", ln.Addr().String(), 64, 8)
	peer, err := c.AddRemotePeer(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := c.PostRead([]int{0}, peer.Agent, []int{1}, []byte("a:b"))
	if waitEnd(t, c, h) != xfer.Failed {
		t.Fatal("READ from a stalled producer did not fail")
	}
}

func agentMetaBytes(t *testing.T, name, addr string, bs, n int) []byte {
	t.Helper()
	b, err := encodeMeta(agentMeta{Version: metaVersion, Name: name, Addr: addr, Incarnation: "x", BlockSize: bs, Blocks: n})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Whatever a producer puts in its agent metadata, registering it fails
// cleanly or yields a usable peer; it never panics.
func FuzzTCPAddRemotePeer(f *testing.F) {
	good, _ := encodeMeta(agentMeta{Version: 1, Name: "p", Addr: "127.0.0.1:1", Incarnation: "x", BlockSize: 64, Blocks: 8})
	f.Add(good)
	f.Add([]byte{0x91, 0x91, 0x91, 0x91})
	f.Add(bytes.Repeat([]byte{0x91}, 4000))
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
	peer, err := c.AddRemotePeer(agentMetaBytes(t, "stalled", ln.Addr().String(), 64, 8), nil)
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
	if _, err := c.PostRead([]int{0}, peer.Agent, []int{1}, nil); !errors.Is(err, ErrBusy) {
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
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return ln
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

// The same-host path passes the suite, and every READ in it was a copy
// out of the shared region.
func TestSharedConformance(t *testing.T) {
	var consumers []*TCPData
	xfertest.Conformance(t, func(t *testing.T) xfertest.Pair {
		cr, pr := newRegion(t, 128, 4096), newSharedRegion(t, 128, 4096)
		c := newTCP(t, cr, TCPConfig{Name: "consumer"})
		p := newTCP(t, pr, TCPConfig{Name: "producer", Listen: "127.0.0.1:0", Authorize: allowAll})
		consumers = append(consumers, c)
		return xfertest.Pair{Consumer: c, Producer: p, ConsumerBlock: cr.Block, ProducerBlock: pr.Block, Blocks: 128}
	})
	copies := uint64(0)
	for _, c := range consumers {
		copies += c.copies.Load()
	}
	if copies == 0 {
		t.Fatal("no READ took the shared path")
	}
}

// readOne posts one READ of producer block 3 into local block 0 and waits
// for its end.
func readOne(t *testing.T, c, p *TCPData) xfer.Progress {
	t.Helper()
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{0}, peer.Agent, []int{3}, []byte("s:m"))
	if err != nil {
		t.Fatal(err)
	}
	return waitEnd(t, c, h)
}

// A consumer told not to map, or a producer told not to offer, reads over
// TCP; the bytes are the same.
func TestSharedOptOut(t *testing.T) {
	for _, tc := range []struct{ consumer, producer bool }{{true, false}, {false, true}} {
		cr, pr := newRegion(t, 8, 4096), newSharedRegion(t, 8, 4096)
		pr.Block(3)[7] = 42
		c := newTCP(t, cr, TCPConfig{NoSharedMemory: tc.consumer})
		p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll, NoSharedMemory: tc.producer})
		if got := readOne(t, c, p); got != xfer.Complete || cr.Block(0)[7] != 42 {
			t.Fatalf("%+v: %v, byte %d", tc, got, cr.Block(0)[7])
		}
		if c.copies.Load() != 0 {
			t.Fatalf("%+v: copied from the shared region", tc)
		}
	}
}

// A revocation between the grant and the end of the copy fails the READ:
// the producer may have given the blocks to another entry meanwhile.
func TestSharedRevokedCopyFails(t *testing.T) {
	cr, pr := newRegion(t, 8, 4096), newSharedRegion(t, 8, 4096)
	c := newTCP(t, cr, TCPConfig{})
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	c.beforeCopy = func() { p.revokes.Add(1) }
	if got := readOne(t, c, p); got != xfer.Failed {
		t.Fatalf("READ over a revoked hold: %v", got)
	}
	c.beforeCopy = nil
	if got := readOne(t, c, p); got != xfer.Complete || c.copies.Load() != 1 {
		t.Fatalf("READ after: %v, %d copies", got, c.copies.Load())
	}
}

// A hello with a wrong token is refused; a consumer that never sends done
// loses its hold after IOTimeout (counted as a revocation), and its
// notification is never queued.
func TestSharedHolds(t *testing.T) {
	pr := newSharedRegion(t, 8, 4096)
	released := make(chan struct{}, 1)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", IOTimeout: 200 * time.Millisecond,
		Authorize: func(string, []byte, []int) (func(), bool) {
			return func() { released <- struct{}{} }, true
		}})
	dial := func(token []byte) net.Conn {
		conn, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(appendHello2(nil, "raw", token))
		return conn
	}
	bad := dial(make([]byte, tokenLen))
	defer bad.Close()
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bad.Read(make([]byte, 1)); err == nil || errTimeout(err) != nil {
		t.Fatalf("wrong token: %v", err)
	}
	good := dial(pr.Header()[:tokenLen])
	defer good.Close()
	good.Write(appendRead(nil, 1, []byte("s:m"), 1, spans(nil, []int{2}), false))
	head := make([]byte, headLen+17)
	good.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(good, head); err != nil || head[headLen+8] != dataCopy {
		t.Fatalf("answer %v, %v", head, err)
	}
	start := time.Now()
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("hold never released")
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("hold released after %v", waited)
	}
	if p.revokes.Load() != 1 {
		t.Fatalf("revocations %d", p.revokes.Load())
	}
	// Too late: no notification. The answer to a second READ shows the
	// done was read.
	good.Write(appendDone(nil, 1))
	good.Write(appendRead(nil, 2, []byte("s:m2"), 1, spans(nil, []int{2}), false))
	if _, err := io.ReadFull(good, head); err != nil || head[headLen+8] != dataCopy {
		t.Fatalf("second answer %v, %v", head, err)
	}
	if n, _ := p.DrainNotifs(nil); len(n) != 0 {
		t.Fatalf("notification after a revoked hold: %v", n)
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

// A write deadline left on a connection by a blocking write (each READ's
// done frame) must not fail a later READ written without waiting: before
// the fix, every READ posted IOTimeout after the last one broke its
// connection.
func TestTCPIdleAfterDeadline(t *testing.T) {
	cr, pr := newRegion(t, 8, 4096), newRegion(t, 8, 4096)
	pr.Block(3)[0] = 7
	c := newTCP(t, cr, TCPConfig{IOTimeout: 100 * time.Millisecond})
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	for i := range 3 {
		if got := readOne(t, c, p); got != xfer.Complete || cr.Block(0)[0] != 7 {
			t.Fatalf("READ %d: %v", i, got)
		}
		time.Sleep(150 * time.Millisecond) // past the last deadline: the condition itself
	}
}

// Metadata naming a file that is not a producer's region (one of this
// process's own, say, from a hostile producer on another host) is not
// mapped, so none of its bytes leave as a token: the READs go over TCP.
// Nor is a region file whose size is not sealed: shrunk under a copy, it
// would fault the consumer (SIGBUS).
func TestSharedRefusesOtherFiles(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := unix.MemfdCreate(cache.SharedFileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	unsealed := os.NewFile(uintptr(fd), "unsealed")
	defer unsealed.Close()
	for _, f := range []*os.File{f, unsealed} {
		t.Run(f.Name(), func(t *testing.T) { refusesFile(t, f) })
	}
}

func refusesFile(t *testing.T, f *os.File) {
	f.Write(make([]byte, cache.HeaderSize()+8*4096))
	pr := newRegion(t, 8, 4096) // not shared: its metadata names no file
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	var m agentMeta
	if err := msgpack.Unmarshal(p.AgentMetadata(), &m); err != nil {
		t.Fatal(err)
	}
	m.Shm, m.ShmOff = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd()), cache.HeaderSize()
	meta, _ := encodeMeta(m)
	c := newTCP(t, newRegion(t, 8, 4096), TCPConfig{})
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	mapped := c.peers[peer.Agent].shm != nil
	c.mu.Unlock()
	if mapped {
		t.Fatal("mapped a file that is not a shared region")
	}
	h, err := c.PostRead([]int{0}, peer.Agent, []int{3}, []byte("s:m"))
	if err != nil {
		t.Fatal(err)
	}
	if waitEnd(t, c, h) != xfer.Complete || c.copies.Load() != 0 {
		t.Fatal("the READ did not go over TCP")
	}
}

// Consumers in one process share one mapping of a producer's region (its
// page tables are filled once), and it is unmapped with the last of them.
func TestSharedMappingIsShared(t *testing.T) {
	borrowOwn = false // a region of another process, as far as mapping goes
	defer func() { borrowOwn = true }()
	pr := newSharedRegion(t, 8, 4096)
	pr.Block(3)[7] = 42
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	var cs []*TCPData
	for range 3 {
		cr := newRegion(t, 8, 4096)
		c := newTCP(t, cr, TCPConfig{})
		if got := readOne(t, c, p); got != xfer.Complete || cr.Block(0)[7] != 42 || c.copies.Load() != 1 {
			t.Fatalf("READ: %v, byte %d, %d copies", got, cr.Block(0)[7], c.copies.Load())
		}
		cs = append(cs, c)
	}
	mapping := func(c *TCPData) (*byte, regionKey) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, pe := range c.peers {
			return unsafe.SliceData(pe.shm), pe.shmKey
		}
		t.Fatal("no peer")
		return nil, regionKey{}
	}
	first, key := mapping(cs[0])
	for _, c := range cs[1:] {
		if m, _ := mapping(c); m != first {
			t.Fatal("a second consumer in the process mapped the region again")
		}
	}
	refs := func() int {
		regionMaps.Lock()
		defer regionMaps.Unlock()
		if r := regionMaps.m[key]; r != nil {
			return r.refs
		}
		return 0
	}
	if n := refs(); n != 3 {
		t.Fatalf("%d references, want 3", n)
	}
	cs[0].Close()
	if n := refs(); n != 2 {
		t.Fatalf("after one Close: %d references", n)
	}
	pr.Block(3)[7] = 43 // the others still read through the mapping
	if got := readOne(t, cs[1], p); got != xfer.Complete {
		t.Fatalf("READ after another consumer closed: %v", got)
	}
	cs[1].Close()
	cs[2].Close()
	if n := refs(); n != 0 {
		t.Fatalf("after the last Close: %d references", n)
	}
}

// A READ's ids are kept as runs; runs that break at different places on
// the two sides land every block where it belongs, over TCP, the
// same-host copy and the precopier (a READ of at least precopyMin).
func TestScatteredRuns(t *testing.T) {
	const bs = 4096
	n := 2*precopyMin/bs + 7
	for _, tc := range []struct {
		name     string
		noShared bool
		blocks   int
	}{{"tcp", true, 6}, {"shm", false, 6}, {"tcp-large", true, n}, {"shm-precopied", false, n}} {
		t.Run(tc.name, func(t *testing.T) {
			pr, cr := newSharedRegion(t, 2*n, bs), newRegion(t, 2*n, bs)
			for b := range 2 * n {
				for i := range pr.Block(b) {
					pr.Block(b)[i] = byte(b*7 + i)
				}
			}
			c := newTCP(t, cr, TCPConfig{NoSharedMemory: tc.noShared})
			auth := allowAll
			if tc.name == "shm-precopied" {
				// Answer only once the precopier copied: the reader would
				// otherwise copy first whenever it wins the race.
				auth = func(a string, n []byte, b []int) (func(), bool) {
					for end := time.Now().Add(5 * time.Second); c.precopies.Load() == 0 && time.Now().Before(end); {
						time.Sleep(time.Millisecond)
					}
					return allowAll(a, n, b)
				}
			}
			p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: auth})
			peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
			if err != nil {
				t.Fatal(err)
			}
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
			h, err := c.PostRead(local, peer.Agent, remote, []byte("s:m"))
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
			if pre := c.precopies.Load(); (pre > 0) != (tc.name == "shm-precopied") {
				t.Fatalf("%d precopies", pre)
			}
		})
	}
}

// A large READ the producer refuses fails, whether or not the precopier
// copied its blocks first.
func TestPrecopiedRefusedFails(t *testing.T) {
	const bs = 4096
	n := 2 * precopyMin / bs
	pr, cr := newSharedRegion(t, n, bs), newRegion(t, n, bs)
	c := newTCP(t, cr, TCPConfig{})
	deny := func(string, []byte, []int) (func(), bool) { return nil, false }
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: deny})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	for range 5 {
		h, err := c.PostRead(ids, peer.Agent, ids, []byte("s:m"))
		if err != nil {
			t.Fatal(err)
		}
		if got := waitEnd(t, c, h); got != xfer.Failed {
			t.Fatalf("refused READ: %v (%d precopies)", got, c.precopies.Load())
		}
		c.Release(h)
	}
}

// Large READs released at once, with the precopier racing the Release:
// once Release returns nothing writes into their blocks (canaries written
// then are intact after Close, which waits for every goroutine).
func TestPrecopierRespectsRelease(t *testing.T) {
	for _, board := range []bool{false, true} {
		t.Run(fmt.Sprintf("board=%v", board), func(t *testing.T) { precopierRespectsRelease(t, board) })
	}
}

// precopierRespectsRelease: with board, the READs copy under a published
// grant (copyFast on the precopier), else under the producer's answer.
func precopierRespectsRelease(t *testing.T, board bool) {
	const bs = 4096
	n := 2 * precopyMin / bs
	pr, cr := newSharedRegion(t, n, bs), newRegion(t, 8*n, bs)
	for b := range n {
		for i := range pr.Block(b) {
			pr.Block(b)[i] = 0x11
		}
	}
	c, err := NewTCPData(TCPConfig{Logger: quiet}, cr)
	if err != nil {
		t.Fatal(err)
	}
	pcfg := TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll}
	notif := []byte("s:m")
	if board {
		pcfg.Authorize, notif = nil, []byte("s:m#1")
	}
	p := newTCP(t, pr, pcfg)
	if board {
		p.SetAuthorizer(allowAll)
		p.ClaimGrantBoard()
		p.PublishGrant(1)
	}
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	remote := make([]int, n)
	for i := range remote {
		remote[i] = i
	}
	for round := range 40 {
		local := make([]int, n)
		for i := range local {
			local[i] = (round%8)*n + i
		}
		h, err := c.PostRead(local, peer.Agent, remote, notif)
		if err != nil {
			t.Fatal(err)
		}
		if round%3 == 1 {
			time.Sleep(time.Duration(round) * 20 * time.Microsecond) // sometimes mid-copy
		}
		if err := c.Release(h); err != nil {
			t.Fatal(err)
		}
		for _, b := range local {
			for i := range cr.Block(b) {
				cr.Block(b)[i] = 0xa5
			}
		}
	}
	c.Close()
	for b := range 8 * n {
		for _, v := range cr.Block(b) {
			if v != 0xa5 {
				t.Fatalf("block %d written after its READ was released", b)
			}
		}
	}
	if board && c.fastCopies.Load() == 0 {
		t.Log("no READ was copied before its Release") // the race went one way every round
	}
}

// A consumer that sends a READ id it already has in flight is cut off,
// and every grant the producer held for it is released: reusing an id must
// not overwrite (and so lose) a hold on the same-host path, nor a pending
// notification on either path.
func TestDuplicateReadIDReleasesHolds(t *testing.T) {
	for _, shared := range []bool{true, false} {
		pr := newSharedRegion(t, 8, 4096)
		var mu sync.Mutex
		held := 0
		p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", IOTimeout: 5 * time.Second,
			Authorize: func(string, []byte, []int) (func(), bool) {
				mu.Lock()
				held++
				mu.Unlock()
				return func() { mu.Lock(); held--; mu.Unlock() }, true
			}})
		conn, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if shared {
			conn.Write(appendHello2(nil, "raw", pr.Header()[:tokenLen]))
		} else {
			conn.Write(appendHello(nil, "raw"))
		}
		conn.Write(appendRead(nil, 7, []byte("s:a"), 1, spans(nil, []int{2}), false))
		conn.Write(appendRead(nil, 7, []byte("s:b"), 1, spans(nil, []int{3}), false))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, conn); err != nil {
			t.Fatalf("shared %v: the connection was not closed: %v", shared, err)
		}
		end := time.Now().Add(2 * time.Second)
		for {
			mu.Lock()
			n := held
			mu.Unlock()
			if n == 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("shared %v: %d grants still held after the connection closed", shared, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
