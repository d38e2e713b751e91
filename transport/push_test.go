package transport

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/xfer"
)

// pushPair is a consumer and a producer over TCP with pushes on: one
// connection, already up (its stage frame seen), the producer's blocks
// filled with distinct bytes, its gate counting the READs it was asked.
type pushPair struct {
	c, p   *TCPData
	cr, pr *cache.Region
	agent  string // the producer, as the consumer's peer
	asked  atomic.Int32
	gate   chan struct{} // when set, READs under grant 100 wait for it
	bs     int
}

func newPushPair(t *testing.T, pushBuffer int) *pushPair {
	t.Helper()
	const bs = 256
	pp := &pushPair{cr: newRegion(t, 16, bs), pr: newRegion(t, 16, bs), bs: bs}
	for b := range 16 {
		for i := range pp.pr.Block(b) {
			pp.pr.Block(b)[i] = byte(b*37 + i)
		}
	}
	pp.p = newTCP(t, pp.pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: func(_ string, notif []byte, _ []int) (func(), bool) {
		pp.asked.Add(1)
		if bytes.HasSuffix(notif, []byte("#100")) && pp.gate != nil {
			<-pp.gate
		}
		return func() {}, true
	}})
	pp.c = newTCP(t, pp.cr, TCPConfig{Conns: 1, PushBuffer: pushBuffer})
	peer, err := pp.c.AddRemotePeer(pp.p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pp.agent = peer.Agent
	// A first READ brings the connection up; its stage frame makes the
	// producer push to it.
	if pp.read(t, []int{15}, []int{15}, "s:warm#1") != xfer.Complete {
		t.Fatal("warm-up READ failed")
	}
	notified(t, pp.p, 1)
	pp.asked.Store(0)
	until(t, "the producer takes pushes", func() bool {
		pp.p.mu.Lock()
		defer pp.p.mu.Unlock()
		return len(pp.p.pushTo[pp.c.Name()]) == 1
	})
	return pp
}

// until polls cond (an event on another goroutine, not a time) for 10 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(50 * time.Microsecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

func (pp *pushPair) post(t *testing.T, local, remote []int, notif string) xfer.Handle {
	t.Helper()
	h, err := pp.c.PostRead(local, pp.agent, remote, []byte(notif))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (pp *pushPair) read(t *testing.T, local, remote []int, notif string) xfer.Progress {
	t.Helper()
	return waitEnd(t, pp.c, pp.post(t, local, remote, notif))
}

// push pushes the blocks of the grant notif names and returns a count of
// its releases.
func (pp *pushPair) push(t *testing.T, notif string, blocks []int) *atomic.Int32 {
	t.Helper()
	var released atomic.Int32
	if !pp.p.Push(pp.c.Name(), []byte(notif), blocks, func() { released.Add(1) }) {
		t.Fatalf("%s not pushed", notif)
	}
	return &released
}

func (pp *pushPair) staged(notif string) bool {
	pk := pp.c.peers[pp.agent]
	pk.smu.Lock()
	defer pk.smu.Unlock()
	st := pk.staged[notif]
	return st != nil && st.ready
}

func (pp *pushPair) same(t *testing.T, local, remote []int) {
	t.Helper()
	for i := range local {
		if !bytes.Equal(pp.cr.Block(local[i]), pp.pr.Block(remote[i])) {
			t.Fatalf("local block %d does not hold remote block %d", local[i], remote[i])
		}
	}
}

// notified waits for the producer's notifications and returns them.
func notified(t *testing.T, p *TCPData, n int) []string {
	t.Helper()
	var got []string
	until(t, fmt.Sprintf("%d notifications", n), func() bool {
		ns, _ := p.DrainNotifs(nil)
		for _, x := range ns {
			got = append(got, string(x.Msg))
		}
		return len(got) >= n
	})
	return got
}

// A pushed grant's READ lands from the push: the producer is not asked,
// the bytes are its blocks', its hold ends once, and the notification
// comes as for any READ.
func TestPushLandsWithoutRead(t *testing.T) {
	pp := newPushPair(t, 0)
	released := pp.push(t, "s:m#7", []int{3, 4, 9})
	until(t, "the push is kept", func() bool { return pp.staged("s:m#7") })
	if p := pp.read(t, []int{0, 1, 2}, []int{3, 4, 9}, "s:m#7"); p != xfer.Complete {
		t.Fatalf("READ ended %v", p)
	}
	pp.same(t, []int{0, 1, 2}, []int{3, 4, 9})
	if n := pp.asked.Load(); n != 0 {
		t.Fatalf("the producer was asked %d times", n)
	}
	if n := released.Load(); n != 1 {
		t.Fatalf("hold released %d times", n)
	}
	if got := notified(t, pp.p, 1); got[0] != "s:m#7" {
		t.Fatalf("notifications %q", got)
	}
	if s := pp.c.Stats(); s.Pushed != 1 || s.PushDrops != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A READ of other blocks than the push's, of another grant, or of the
// same grant number in another session (a producer session restarted on
// the same data plane numbers its grants from 1 again) is asked for as
// usual; the push stays for its own READ.
func TestPushOnlyForItsBlocks(t *testing.T) {
	pp := newPushPair(t, 0)
	pp.push(t, "s:m#7", []int{3, 4})
	until(t, "the push is kept", func() bool { return pp.staged("s:m#7") })
	if pp.read(t, []int{0, 1}, []int{4, 3}, "s:m#7") != xfer.Complete || pp.read(t, []int{2}, []int{3}, "s:m#8") != xfer.Complete ||
		pp.read(t, []int{3, 4}, []int{3, 4}, "t:m#7") != xfer.Complete {
		t.Fatal("READ failed")
	}
	pp.same(t, []int{0, 1, 2, 3, 4}, []int{4, 3, 3, 3, 4})
	if n := pp.asked.Load(); n != 3 {
		t.Fatalf("the producer was asked %d times, want 3", n)
	}
	if !pp.staged("s:m#7") {
		t.Fatal("the push is gone")
	}
}

// A READ that went out before its push came lands from the push, and the
// producer, which reads the READ after the push on that connection,
// answers it "pushed": the bytes cross once.
func TestPushAfterRead(t *testing.T) {
	pp := newPushPair(t, 0)
	pp.gate = make(chan struct{})
	gated := pp.post(t, []int{5}, []int{12}, "s:g#100") // holds the producer's serving loop
	until(t, "the gated READ is at the gate", func() bool { return pp.asked.Load() == 1 })
	h := pp.post(t, []int{0, 1}, []int{6, 7}, "s:m#9") // queued behind it
	pp.push(t, "s:m#9", []int{6, 7})
	until(t, "the push landed", func() bool { return pp.c.Stats().Pushed == 1 })
	close(pp.gate)
	if waitEnd(t, pp.c, gated) != xfer.Complete || waitEnd(t, pp.c, h) != xfer.Complete {
		t.Fatal("READ failed")
	}
	pp.same(t, []int{0, 1, 5}, []int{6, 7, 12})
	if n := pp.asked.Load(); n != 1 {
		t.Fatalf("the producer was asked %d times, want 1 (the gated READ)", n)
	}
	got := notified(t, pp.p, 2)
	if len(got) != 2 || got[0] != "s:g#100" || got[1] != "s:m#9" {
		t.Fatalf("notifications %q", got)
	}
}

// A READ released before its push came keeps its blocks as they were: the
// push's bytes are dropped.
func TestPushAfterReleasedRead(t *testing.T) {
	pp := newPushPair(t, 0)
	pp.gate = make(chan struct{})
	gated := pp.post(t, []int{5}, []int{12}, "s:g#100")
	until(t, "the gated READ is at the gate", func() bool { return pp.asked.Load() == 1 })
	canary := bytes.Repeat([]byte{0xee}, pp.bs)
	copy(pp.cr.Block(0), canary)
	h := pp.post(t, []int{0}, []int{6}, "s:m#9")
	if err := pp.c.Release(h); err != nil {
		t.Fatal(err)
	}
	pp.push(t, "s:m#9", []int{6})
	until(t, "the push dropped", func() bool { return pp.c.Stats().PushDrops == 1 })
	close(pp.gate)
	if waitEnd(t, pp.c, gated) != xfer.Complete {
		t.Fatal("gated READ failed")
	}
	if !bytes.Equal(pp.cr.Block(0), canary) {
		t.Fatal("a released READ's block was written")
	}
}

// Pushes nobody claims are evicted oldest first when a new one needs the
// room; a READ of an evicted one asks the producer to send the bytes
// again, although it pushed them on that connection.
func TestPushEvictedIsResent(t *testing.T) {
	pp := newPushPair(t, 8*256) // pushes of up to 2 blocks, 4 kept
	for g := 1; g <= 5; g++ {
		n := fmt.Sprintf("s:m#%d", 10+g)
		pp.push(t, n, []int{2 * g, 2*g + 1})
		until(t, "the push is kept", func() bool { return pp.staged(n) })
	}
	if pp.staged("s:m#11") || pp.c.Stats().PushDrops != 1 {
		t.Fatalf("the oldest push was not evicted: %+v", pp.c.Stats())
	}
	if pp.read(t, []int{0, 1}, []int{2, 3}, "s:m#11") != xfer.Complete {
		t.Fatal("READ of the evicted push failed")
	}
	if pp.read(t, []int{2, 3}, []int{4, 5}, "s:m#12") != xfer.Complete {
		t.Fatal("READ of a kept push failed")
	}
	pp.same(t, []int{0, 1, 2, 3}, []int{2, 3, 4, 5})
	if n := pp.asked.Load(); n != 1 {
		t.Fatalf("the producer was asked %d times, want 1", n)
	}
	if pp.p.Push(pp.c.Name(), []byte("s:m#99"), []int{0, 1, 2}, func() {}) {
		t.Fatal("pushed more than a quarter of the consumer's room")
	}
}

// A consumer that asks for no pushes gets none; a producer told not to
// push does not.
func TestPushOptOut(t *testing.T) {
	for _, tc := range []struct{ consumer, producer bool }{{true, false}, {false, true}} {
		cr, pr := newRegion(t, 8, 256), newRegion(t, 8, 256)
		p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll, NoPush: tc.producer})
		c := newTCP(t, cr, TCPConfig{Conns: 1, PushBuffer: map[bool]int{true: -1}[tc.consumer]})
		if readOne(t, c, p) != xfer.Complete {
			t.Fatal("READ failed")
		}
		if p.Push(c.Name(), []byte("s:m#1"), []int{1}, func() {}) {
			t.Fatalf("%+v: pushed", tc)
		}
	}
}

// Pushes only come on the consumer's first connection, where its READs
// go first.
func TestPushFirstLinkOnly(t *testing.T) {
	cr, pr := newRegion(t, 64, 256), newRegion(t, 64, 256)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	c := newTCP(t, cr, TCPConfig{Conns: 3})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var hs []xfer.Handle
	for i := range 64 { // enough to bring every connection up
		h, err := c.PostRead([]int{i}, peer.Agent, []int{i}, []byte("s:m"))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		waitEnd(t, c, h)
	}
	p.mu.Lock()
	n := len(p.pushTo[c.Name()])
	p.mu.Unlock()
	if n > 1 {
		t.Fatalf("%d connections take pushes", n)
	}
}

// One READ at a time, whichever writer takes the first READ, the first
// connection (the one pushes come on) is the one that comes up, and the
// grants after it are pushed. Broken later, it comes up again with the
// next READ, although other connections are up and free. (A READ used to
// go on any link up, or on its writer's own: the first could stay down
// for good, and nothing was pushed.)
func TestPushFirstLinkComesUp(t *testing.T) {
	const bs = 256
	cr, pr := newRegion(t, 16, bs), newRegion(t, 16, bs)
	for b := range 16 {
		for i := range pr.Block(b) {
			pr.Block(b)[i] = byte(b*37 + i)
		}
	}
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	c := newTCP(t, cr, TCPConfig{Conns: 4})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pk := c.peers[peer.Agent]
	post := func(b int, notif string) xfer.Handle {
		t.Helper()
		h, err := c.PostRead([]int{b}, peer.Agent, []int{b}, []byte(notif))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	read := func(b int, notif string) {
		t.Helper()
		if waitEnd(t, c, post(b, notif)) != xfer.Complete {
			t.Fatalf("READ %s failed", notif)
		}
		if !bytes.Equal(cr.Block(b), pr.Block(b)) {
			t.Fatalf("block %d: wrong bytes", b)
		}
	}
	pushedTo := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pushTo[c.Name()])
	}
	pushed := func(g int) { // a grant pushed, then its READ
		t.Helper()
		notif := fmt.Sprintf("s:m%d#%d", g, g)
		// Push declines while the connection is being written to (the
		// answer to the READ before, just out): try again.
		until(t, notif+" pushed", func() bool { return p.Push(c.Name(), []byte(notif), []int{g}, func() {}) })
		until(t, "the push is in", func() bool {
			pk.smu.Lock()
			defer pk.smu.Unlock()
			return pk.staged[notif] != nil && pk.staged[notif].ready
		})
		read(g, notif)
	}

	read(0, "s:m0#1")
	until(t, "the producer takes pushes", func() bool { return pushedTo() == 1 })
	for g := 2; g < 10; g++ {
		pushed(g)
	}
	if st := c.Stats(); st.Pushed != 8 {
		t.Fatalf("%d READs landed from pushes, want 8", st.Pushed)
	}

	// Other links up: READs queued while the first is being written to.
	l0 := pk.links[0]
	l0.wmu.Lock()
	var hs []xfer.Handle
	for b := range 8 {
		hs = append(hs, post(b, fmt.Sprintf("s:burst%d#%d", b, 100+b)))
	}
	until(t, "another link up", func() bool { return pk.links[1].up() || pk.links[2].up() || pk.links[3].up() })
	l0.wmu.Unlock()
	for _, h := range hs {
		waitEnd(t, c, h)
	}
	// The first breaks; the next READ brings it up again.
	l0.mu.Lock()
	l0.breakConnLocked(errors.New("test: broken"))
	l0.mu.Unlock()
	until(t, "the producer sees the first link gone", func() bool { return pushedTo() == 0 })
	read(10, "s:m10#10")
	if !l0.up() {
		t.Fatal("the first link is still down")
	}
	until(t, "the producer takes pushes again", func() bool { return pushedTo() == 1 })
	pushed(11)
}

// A producer that pushes badly breaks only its own connection: the READs
// on it fail, nothing panics, and nothing lands in the consumer's blocks
// but the failed READ's own.
func TestHostilePushes(t *testing.T) {
	const bs = 256
	for name, frame := range map[string]func() []byte{
		"size not whole blocks": func() []byte { return pushFrame("s:m#1", bs+1, nil) },
		"over the room":         func() []byte { return pushFrame("s:m#1", 64*bs, nil) },
		"block out of range":    func() []byte { return pushFrame("s:m#1", bs, []int{99}) },
		"empty":                 func() []byte { return pushFrame("s:m#1", 0, nil) },
		"no notification":       func() []byte { return pushFrame("", bs, []int{1}) },
		"notification too long": func() []byte { return pushFrame(strings.Repeat("n", 2000), bs, []int{1}) },
		"short":                 func() []byte { return pushFrame("s:m#1", 2*bs, []int{1, 2})[:40] },
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := ln.Accept()
				if err != nil {
					return
				}
				defer s.Close()
				s.Write(frame())
				if name == "short" {
					return // and the connection closes mid-push
				}
				s.SetReadDeadline(time.Now().Add(5 * time.Second))
				var b [512]byte
				for {
					if _, err := s.Read(b[:]); err != nil {
						return
					}
				}
			}()
			cr := newRegion(t, 8, bs)
			canary := bytes.Repeat([]byte{0xee}, 8*bs)
			copy(cr.Bytes(), canary)
			c := newTCP(t, cr, TCPConfig{Conns: 1, PushBuffer: 16 * bs})
			meta, err := encodeMeta(agentMeta{Version: metaVersion, Name: "evil", Addr: ln.Addr().String(), Incarnation: "x",
				BlockSize: bs, Blocks: 8, Push: true})
			if err != nil {
				t.Fatal(err)
			}
			peer, err := c.AddRemotePeer(meta, nil)
			if err != nil {
				t.Fatal(err)
			}
			h, err := c.PostRead([]int{0, 1}, peer.Agent, []int{1, 2}, []byte("s:m#1"))
			if err != nil {
				t.Fatal(err)
			}
			if p := waitEnd(t, c, h); p != xfer.Failed {
				t.Fatalf("READ ended %v", p)
			}
			// A READ that fails midway may leave some of its bytes (as any
			// READ); nothing else is written.
			from := 0
			if name == "short" {
				from = 2 * bs
			}
			if !bytes.Equal(cr.Bytes()[from:], canary[from:]) {
				t.Fatal("a hostile push wrote the consumer's blocks")
			}
			c.Close()
			wg.Wait()
		})
	}
}

func pushFrame(notif string, size int, ids []int) []byte {
	return append(appendPushHead(nil, []byte(notif), uint64(size), ids), make([]byte, max(0, size))...)
}

// A consumer's connections that take no pushes (stage 0) still carry the
// notifications of pushes landed; one that sent no stage frame cannot.
func TestNotifyAfterStage(t *testing.T) {
	pr := newRegion(t, 8, 256)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	send := func(frames ...[]byte) {
		c, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, f := range frames {
			c.Write(f)
		}
		// The producer reads in order: a READ after the notify is answered
		// only if the notify did not close the connection.
		c.Write(appendRead(nil, 1, []byte("s:x"), 1, spans(nil, []int{0}), false))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		c.Read(b[:])
	}
	send(appendHello(nil, "cons"), appendStage(nil, 0), appendNotify(nil, []byte("s:m#1")))
	if got := notified(t, p, 1); got[0] != "s:m#1" {
		t.Fatalf("notifications %q", got)
	}
	send(appendHello(nil, "cons"), appendNotify(nil, []byte("s:m#2")))
	if ns, _ := p.DrainNotifs(nil); len(ns) != 0 {
		t.Fatalf("a notify without a stage frame was taken: %q", ns[0].Msg)
	}
}
