package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// quietEcho returns a client connected to a server that echoes, kept on
// TCP, neither side pinging: no PING or PONG ends a wait's read.
func quietEcho(t testing.TB) (*Client, string) {
	t.Helper()
	s := newServer(t, ServerConfig{PingInterval: time.Hour})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	echo(t, s, stop)
	c := newClient(t, ClientConfig{NoSameHost: true, PingInterval: time.Hour})
	ep := s.Endpoint()
	clientConn(t, c, ep)
	return c, ep
}

// twoEchoes returns a client kept on TCP and two servers that echo, the
// client connected to the second.
func twoEchoes(t testing.TB) (*Client, *Server, *Server) {
	t.Helper()
	s1, s2 := newServer(t, ServerConfig{}), newServer(t, ServerConfig{})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	echo(t, s1, stop)
	echo(t, s2, stop)
	c := newClient(t, ClientConfig{NoSameHost: true})
	clientConn(t, c, s2.Endpoint())
	return c, s1, s2
}

// mineOf makes the connection to ep the one c's waiting loop reads itself
// (stepReads.mine): its goroutine hands it over as it delivers a reply to
// a loop that waits. ep echoes.
func mineOf(t testing.TB, c *Client, ep string) *guardConn {
	t.Helper()
	var g *guardConn
	poll(t, 10*time.Second, "a connection the waiting loop reads", func() bool {
		woke := make(chan struct{})
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, ok := c.waitOwn(ctx, nil, time.Second); !ok { // as a Pool waits
				c.Wait(ctx)
			}
			close(woke)
		}()
		if err := c.Send(ep, []byte("mine?")); err != nil {
			t.Fatal(err)
		}
		<-woke
		c.Drain(nil)
		c.steps.mu.Lock()
		g = c.steps.mine
		c.steps.mu.Unlock()
		return g != nil
	})
	// Every request answered and drained: no late reply ends a wait.
	poll(t, 10*time.Second, "every reply", func() bool {
		c.Drain(nil)
		st := c.Stats()
		return st.Received == st.Sent
	})
	return g
}

// ownWaiting starts c.waitOwn on a goroutine once its read is under way,
// and returns what it returns.
func ownWaiting(t testing.TB, c *Client, ctx context.Context, ready <-chan struct{}, d time.Duration) <-chan [2]bool {
	t.Helper()
	out := make(chan [2]bool, 1)
	go func() {
		woke, ok := c.waitOwn(ctx, ready, d)
		out <- [2]bool{woke, ok}
	}()
	poll(t, 10*time.Second, "the waiter's read", func() bool {
		c.steps.imu.Lock()
		g := c.steps.reading
		c.steps.imu.Unlock()
		if g == nil {
			return false
		}
		q := g.Conn.(*quietConn)
		if q.rmu.TryLock() { // not in its read yet
			q.rmu.Unlock()
			return false
		}
		return true
	})
	return out
}

// ended returns what the wait returned, failing if it runs on for 10 s.
func ended(t testing.TB, what string, out <-chan [2]bool) (woke bool) {
	t.Helper()
	select {
	case r := <-out:
		if !r[1] {
			t.Fatalf("%s: the wait did not read its connection", what)
		}
		return r[0]
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not end the waiter's own read", what)
	}
	return false
}

// Whatever else is for the loop ends a wait that reads its connection
// itself: a reply or a death on another connection, the data plane's
// signal (through its hook), a token on ready, the context, the wait's
// own limit, a wait on the same client beside it, Close; and a reply on
// its own connection. After each, the connection still answers.
func TestOwnWaitEnds(t *testing.T) {
	c, s1, s2 := twoEchoes(t)
	ep1, ep2 := s1.Endpoint(), s2.Endpoint()
	d, err := NewTCPData(TCPConfig{Logger: quiet}, newRegion(t, 8, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	defer tcpPlane{d}.OnSignal(clientHooks{c}.Interrupt)()
	still := func(what string) {
		t.Helper()
		c.Drain(nil)
		if err := c.Send(ep1, []byte("still")); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
		waitInbound(t, c, 1, 10*time.Second)
	}
	bg := context.Background()
	for _, tc := range []struct {
		name string
		wake func() // nil: the reply on the waiter's own connection
		ctx  func() (context.Context, func())
		d    time.Duration
		want bool
	}{
		{name: "its own reply", wake: func() { c.Send(ep1, []byte("own")) }, want: true},
		{name: "another producer's reply", wake: func() { c.Send(ep2, []byte("other")) }, want: true},
		{name: "the data plane's signal", wake: d.signal, want: true},
		{name: "the limit", d: 20 * time.Millisecond, want: true},
		{name: "the context", ctx: func() (context.Context, func()) {
			ctx, cancel := context.WithCancel(bg)
			return ctx, cancel
		}, want: false},
		{name: "a wait beside it", wake: func() {
			go func() {
				ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
				defer cancel()
				c.Wait(ctx)
			}()
		}, want: true},
	} {
		mineOf(t, c, ep1)
		ctx, cancel := bg, func() {}
		if tc.ctx != nil {
			ctx, cancel = tc.ctx()
		}
		limit := tc.d
		if limit == 0 {
			limit = -1
		}
		start := time.Now()
		out := ownWaiting(t, c, ctx, nil, limit)
		if tc.wake != nil {
			tc.wake()
		} else {
			cancel()
		}
		if woke := ended(t, tc.name, out); woke != tc.want {
			t.Fatalf("%s: the wait returned %v", tc.name, woke)
		}
		if tc.d > 0 && time.Since(start) < tc.d {
			t.Fatalf("%s: returned after %v", tc.name, time.Since(start))
		}
		cancel()
		still(tc.name)
	}

	// A token on ready ends it before it reads.
	mineOf(t, c, ep1)
	ready := make(chan struct{}, 1)
	ready <- struct{}{}
	if woke, ok := c.waitOwn(bg, ready, -1); !woke || !ok {
		t.Fatalf("with ready signalled: %v, %v", woke, ok)
	}

	// A death on another connection.
	mineOf(t, c, ep1)
	out := ownWaiting(t, c, bg, nil, -1)
	s2.Close()
	ended(t, "another producer's death", out)
	if dead := c.Dead(nil); len(dead) != 1 || dead[0].Addr != ep2 {
		t.Fatalf("dead: %v", dead)
	}
	still("a death")

	// Close.
	mineOf(t, c, ep1)
	out = ownWaiting(t, c, bg, nil, -1)
	c.Close()
	select {
	case <-out:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the waiter's own read")
	}
}

// A connection's replies reach Drain in order, none lost, whoever reads
// them: its goroutine, a Drain, or a waiting loop's own read; with the
// readers changing hands as the loop waits one way or the other, and a
// second goroutine waiting and draining beside it now and then.
func TestOwnWaitKeepsOrder(t *testing.T) {
	s := newServer(t, ServerConfig{})
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	c := newClient(t, ClientConfig{})
	ep := s.Endpoint()
	const n, window = 20000, 8
	var mu sync.Mutex // Drain and the check, in one order
	got := 0
	var failed error
	drain := func(in []xfer.Inbound) []xfer.Inbound {
		mu.Lock()
		defer mu.Unlock()
		in = c.Drain(in[:0])
		for _, m := range in {
			want := append([]byte("re:"), seq(got)...)
			if string(m.Payload) != string(want) && failed == nil {
				failed = fmt.Errorf("reply %d came where %d was due", binary.BigEndian.Uint64(m.Payload[3:]), got)
			}
			got++
		}
		return in
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		if failed != nil {
			t.Fatal(failed)
		}
		return got
	}
	besideStop := make(chan struct{})
	besideDone := make(chan struct{})
	go func() { // beside the loop
		defer close(besideDone)
		var in []xfer.Inbound
		for {
			select {
			case <-besideStop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Microsecond)
			c.Wait(ctx)
			cancel()
			in = drain(in)
			time.Sleep(time.Millisecond) // now and then: the loop's waits are the most
		}
	}()
	defer func() { close(besideStop); <-besideDone }()
	rng := rand.New(rand.NewPCG(1, 2))
	sent := 0
	var in []xfer.Inbound
	deadline := time.Now().Add(60 * time.Second)
	used := func() bool {
		st := c.Stats()
		return st.ReadInWait > 0 && c.steps.taken.Load() > 0 && st.ReadInWait+c.steps.taken.Load() < st.Received
	}
	for count() < n || !used() {
		for ; sent-count() < window; sent++ {
			if err := c.Send(ep, seq(sent)); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		switch rng.IntN(4) {
		case 0:
			c.Wait(ctx)
		case 1: // steps without waiting
		default:
			c.waitOwn(ctx, nil, time.Duration(rng.IntN(3))*time.Millisecond)
		}
		cancel()
		in = drain(in)
		if time.Now().After(deadline) {
			st := c.Stats()
			t.Fatalf("%d replies of %d sent; read by the waiter %d, in Drain %d, of %d: want each reader used",
				count(), sent, st.ReadInWait, c.steps.taken.Load(), st.Received)
		}
	}
	st := c.Stats()
	t.Logf("%d replies: read by the waiter %d, in Drain %d", st.Received, st.ReadInWait, c.steps.taken.Load())
}

// While the waiting loop reads its connection, no one else does: a Drain
// beside it skips it, and a wait beside it, which hands every hot
// connection back to its goroutine, leaves this one to the waiter until
// it is done, its read's bytes handed on (else its goroutine could read
// and hand on what came after them first).
func TestOwnWaitOneReader(t *testing.T) {
	c, ep := quietEcho(t) // no PING or PONG ends the read
	g := mineOf(t, c, ep)
	var cooled []bool
	c.steps.afterRead = func(g *guardConn) { cooled = append(cooled, !g.hot.Load()) }
	out := ownWaiting(t, c, context.Background(), nil, -1)
	// A Drain beside it leaves the connection to the waiter.
	drained := make(chan struct{})
	go func() { c.Drain(nil); close(drained) }()
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("a Drain beside the waiter waits for its read")
	}
	c.steps.hold() // a wait beside it
	if woke := ended(t, "a wait beside it", out); !woke {
		t.Fatal("the wait returned false")
	}
	if len(cooled) == 0 || slices.Contains(cooled, true) {
		t.Fatalf("handed back to its goroutine while the waiter read it (after each read: %v)", cooled)
	}
	if g.hot.Load() {
		t.Fatal("still hot once its waiter was done: no one reads it for the wait beside")
	}
	c.steps.waited()
	c.steps.afterRead = nil
	c.Drain(nil)
	if err := c.Send(ep, []byte("after")); err != nil {
		t.Fatal(err)
	}
	waitInbound(t, c, 1, 10*time.Second)
}

// A large frame the waiter cannot hold goes back to the connection's
// goroutine with no deadline of the wait left on the socket, however late
// the wait's own clean-up runs and whatever interrupted it: a deadline
// left there would fail the goroutine's read and declare a healthy
// producer dead.
func TestOwnWaitHandsBackWithoutItsDeadline(t *testing.T) {
	s := newServer(t, ServerConfig{PingInterval: time.Hour})
	stop := make(chan struct{})
	defer close(stop)
	big := bytes.Repeat([]byte("B"), 300<<10)
	serve(s, stop, func(p []byte) []byte {
		if string(p) == "big" {
			return big
		}
		return append([]byte("re:"), p...)
	})
	c := newClient(t, ClientConfig{NoSameHost: true, PingInterval: time.Hour})
	ep := s.Endpoint()
	clientConn(t, c, ep)
	mineOf(t, c, ep)
	c.Drain(nil)
	var once sync.Once
	c.steps.afterRead = func(g *guardConn) {
		if len(g.in) < readChunk-(16<<10) { // not yet the read that makes it large
			return
		}
		once.Do(func() {
			c.steps.interrupt() // another producer's reply, just then
			c.steps.imu.Lock()  // the waiter slow to finish
			go func() {
				time.Sleep(300 * time.Millisecond)
				c.steps.imu.Unlock()
			}()
		})
	}
	out := ownWaiting(t, c, context.Background(), nil, -1)
	if err := c.Send(ep, []byte("big")); err != nil {
		t.Fatal(err)
	}
	ended(t, "the large reply", out)
	c.steps.afterRead = nil
	got := waitInbound(t, c, 1, 10*time.Second)
	if dead := c.Dead(nil); len(dead) > 0 {
		t.Fatalf("a healthy producer declared dead: %v", dead)
	}
	if len(got[0].Payload) != len(big) {
		t.Fatalf("a reply of %d bytes", len(got[0].Payload))
	}
}

// A reply the waiter reads and queues wakes a wait beside it, as one its
// goroutine queues does; and a wait beside it that comes before the read
// begins ends it as well as one that comes during the read.
func TestOwnWaitWakesAWaitBeside(t *testing.T) {
	c, ep := quietEcho(t)
	bg := context.Background()

	mineOf(t, c, ep)
	c.Drain(nil)
	beside := make(chan bool, 1)
	var once sync.Once
	c.steps.afterRead = func(*guardConn) {
		once.Do(func() { // read, not yet queued: a wait beside starts
			go func() {
				ctx, cancel := context.WithTimeout(bg, 10*time.Second)
				defer cancel()
				beside <- c.Wait(ctx) && ctx.Err() == nil
			}()
			poll(t, 10*time.Second, "the wait beside", func() bool {
				c.steps.mu.Lock()
				defer c.steps.mu.Unlock()
				return c.steps.waiters == 2
			})
		})
	}
	out := ownWaiting(t, c, bg, nil, -1)
	if err := c.Send(ep, []byte("x")); err != nil {
		t.Fatal(err)
	}
	ended(t, "the reply", out)
	c.steps.afterRead = nil
	if !<-beside {
		t.Fatal("the wait beside slept to its limit with a reply queued")
	}

	for range 50 { // between holdOwn and the read
		mineOf(t, c, ep)
		c.Drain(nil)
		out := make(chan bool, 1)
		go func() {
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			c.waitOwn(ctx, nil, -1)
			out <- ctx.Err() == nil
		}()
		for end := time.Now().Add(10 * time.Second); ; { // no sleep: as soon as it is past
			c.steps.mu.Lock()
			busy := c.steps.ownBusy
			c.steps.mu.Unlock()
			if busy {
				break
			}
			if time.Now().After(end) {
				t.Fatal("the waiter never past holdOwn")
			}
		}
		c.steps.hold()
		if !<-out {
			t.Fatal("a wait beside did not end the waiter's read")
		}
		c.steps.waited()
	}
}

// An interrupt between holdOwn and the read is kept for the read: a wait
// that began holds it, and its read never starts.
func TestOwnWaitKeepsAnEarlyInterrupt(t *testing.T) {
	c, ep := quietEcho(t)
	mineOf(t, c, ep)
	st := &c.steps
	g := st.holdOwn()
	if g == nil {
		t.Fatal("no connection of its own")
	}
	st.interrupt()
	if st.startReading(g, time.Time{}) {
		st.stopReading(g)
		t.Fatal("the read began after an interrupt")
	}
	st.waitedOwn()
	g = st.holdOwn() // a later wait starts clean
	if !st.startReading(g, time.Time{}) {
		t.Fatal("an interrupt of an earlier wait ended a later one")
	}
	st.stopReading(g)
	st.waitedOwn()
}

// A loop that waits between its steps keeps its connection in the poller,
// even after a spell of stepping without waiting took it out: each Drain
// would take it out and each wait put it back.
func TestOwnWaitStaysInThePoller(t *testing.T) {
	c, ep := quietEcho(t)
	g := mineOf(t, c, ep)
	q := g.Conn.(*quietConn)
	for end := time.Now().Add(3 * coolAfter); time.Now().Before(end); time.Sleep(time.Millisecond) {
		c.Drain(nil) // steps without waiting, an engine's step apart
	}
	if !q.detached.Load() {
		t.Fatal("stepped without waiting, still in the poller")
	}
	for i := range 20 {
		c.Send(ep, []byte("x"))
		c.waitOwn(context.Background(), nil, time.Second)
		c.Drain(nil)
		c.steps.mu.Lock()
		still := c.steps.mine == g
		c.steps.mu.Unlock()
		if still && q.detached.Load() {
			t.Fatalf("round %d: out of the poller between a wait and the next", i)
		}
	}
}

// rawRouter is a producer's end that the test writes by hand: what reply
// writes is framed as a ROUTER's reply (["", payload]), bare a single
// frame, which the client counts as malformed.
type rawRouter struct {
	ep    string
	write chan []byte
}

func newRawRouter(t testing.TB) *rawRouter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r := &rawRouter{ep: "tcp://" + ln.Addr().String(), write: make(chan []byte, 64)}
	go func() {
		c, err := acceptAsRouter(ln)
		if err != nil {
			return
		}
		defer c.Close()
		go io.Copy(io.Discard, c)
		for b := range r.write {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { close(r.write) })
	return r
}

func (r *rawRouter) reply(payload string) {
	r.write <- append([]byte{flagMore, 0}, envelope(payload)[2:]...)
}
func (r *rawRouter) bare(payload string) {
	r.write <- append([]byte{0, byte(len(payload))}, payload...)
}

// Only a message queued for the loop ends its wait or makes a connection
// the waiter's: a malformed reply, dropped and counted, neither wakes the
// loop nor leaves a connection that no one reads while it waits.
func TestOwnWaitMalformedWakesNothing(t *testing.T) {
	r := newRawRouter(t)
	c := newClient(t, ClientConfig{PingInterval: time.Hour})
	if err := c.Connect(context.Background(), r.ep); err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	malformed := func(n uint64) {
		poll(t, 10*time.Second, "malformed replies counted", func() bool { return c.Stats().Malformed >= n })
	}
	// A wait as a Pool's, which finds no connection of its own.
	if _, ok := c.waitOwn(bg, nil, 0); ok {
		t.Fatal("a connection of its own before any reply")
	}
	woke := make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		defer cancel()
		woke <- c.Wait(ctx) && ctx.Err() == nil
	}()
	poll(t, 10*time.Second, "the wait", func() bool {
		c.steps.mu.Lock()
		defer c.steps.mu.Unlock()
		return c.steps.waiters == 1
	})
	r.bare("junk")
	malformed(1)
	c.steps.mu.Lock()
	mine := c.steps.mine
	c.steps.mu.Unlock()
	if mine != nil {
		t.Fatal("a malformed reply made its connection the waiter's")
	}
	r.reply("first")
	if !<-woke {
		t.Fatal("the reply did not wake the wait")
	}
	if got := c.Drain(nil); len(got) != 1 || string(got[0].Payload) != "first" {
		t.Fatalf("drained %q", got)
	}
	var g *guardConn
	poll(t, 10*time.Second, "the connection the waiter's", func() bool {
		c.steps.mu.Lock()
		defer c.steps.mu.Unlock()
		g = c.steps.mine
		return g != nil
	})

	out := ownWaiting(t, c, bg, nil, -1)
	for range 5 {
		r.bare("junk")
	}
	malformed(6)
	select {
	case <-out:
		t.Fatal("malformed replies ended the wait")
	default:
	}
	r.reply("second")
	if !ended(t, "the reply", out) {
		t.Fatal("the wait returned false")
	}
	if got := c.Drain(nil); len(got) != 1 || string(got[0].Payload) != "second" {
		t.Fatalf("drained %q", got)
	}
}

// The connection the loop reads itself follows the replies: once another
// connection brought a few while it brought none (its producer went
// quiet, or its replies moved to the same-host socket), it is handed
// back, and the one that answers is read in the wait instead.
func TestOwnWaitFollowsTheReplies(t *testing.T) {
	c, s1, s2 := twoEchoes(t)
	ep1, ep2 := s1.Endpoint(), s2.Endpoint()
	g1 := mineOf(t, c, ep1)
	bg := context.Background()
	for i := range 20 {
		if err := c.Send(ep2, []byte("other")); err != nil {
			t.Fatal(err)
		}
		for !c.pending() {
			if woke, ok := c.waitOwn(bg, nil, time.Second); !ok {
				c.Wait(bg) // as a Pool waits
			} else if !woke {
				t.Fatal("the wait returned false")
			}
		}
		c.Drain(nil)
		c.steps.mu.Lock()
		g := c.steps.mine
		c.steps.mu.Unlock()
		if g != nil && g != g1 {
			before := c.Stats().ReadInWait
			c.Send(ep2, []byte("read in the wait"))
			if woke, ok := c.waitOwn(bg, nil, 10*time.Second); !woke || !ok || c.Stats().ReadInWait != before+1 {
				t.Fatalf("the reply was not read in the wait (%v, %v)", woke, ok)
			}
			t.Logf("handed over after %d replies of the other producer", i+1)
			return
		}
	}
	t.Fatal("the connection whose producer stopped answering is still the waiter's")
}

// A connection made the waiter's while a wait is under way, after that
// wait's wake-up was taken by a Drain, wakes that wait again: its
// goroutine stops reading, and the wait, which reads it only from its
// next start, would sleep with replies unread.
func TestOwnWaitHeatedDuringAWait(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := newRawRouter(t)
	c := newClient(t, ClientConfig{PingInterval: time.Hour})
	bg := context.Background()
	if err := c.Connect(bg, r.ep); err != nil {
		t.Fatal(err)
	}
	r.reply("zero") // the first message comes with the handshake's bytes
	poll(t, 10*time.Second, "the zeroth reply", c.pending)
	c.Drain(nil)
	if _, ok := c.waitOwn(bg, nil, 0); ok { // a Pool's wait asks for one
		t.Fatal("a connection of its own before any reply")
	}
	ctx, cancel := context.WithTimeout(bg, 5*time.Millisecond)
	c.Wait(ctx)
	cancel()
	c.steps.mu.Lock() // a Drain under way
	r.reply("first")
	poll(t, 10*time.Second, "the first reply queued", c.pending)
	time.Sleep(5 * time.Millisecond) // its goroutine blocks in heatOwn
	c.steps.mu.Unlock()
	if got := c.Drain(nil); len(got) != 1 {
		t.Fatalf("drained %q", got)
	}
	if _, ok := c.waitOwn(bg, nil, -1); ok {
		t.Fatal("a connection of its own already")
	}
	ctx, cancel = context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if !c.Wait(ctx) || ctx.Err() != nil {
		t.Fatal("the wait slept on with its connection taken from its goroutine")
	}
	r.reply("second")
	for !c.pending() {
		if woke, ok := c.waitOwn(ctx, nil, -1); !ok {
			c.Wait(ctx)
		} else if !woke {
			t.Fatal("the second reply did not end the wait")
		}
	}
}

// The data plane's signal that ends a wait is taken with it: the next
// wait does not return at once for a step with nothing to do.
func TestOwnWaitTakesTheSignal(t *testing.T) {
	c, ep := quietEcho(t)
	d, err := NewTCPData(TCPConfig{Logger: quiet}, newRegion(t, 8, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	defer tcpPlane{d}.OnSignal(clientHooks{c}.Interrupt)()
	ready := tcpPlane{d}.ConsumerReady()
	mineOf(t, c, ep)
	out := ownWaiting(t, c, context.Background(), ready, -1)
	d.signal()
	ended(t, "the data plane's signal", out)
	if len(ready) != 0 {
		t.Fatal("the signal's token left for the next wait")
	}
}

// Remove of the waiter's connection's producer ends the wait, reports no
// death, and a new dealer for the address answers.
func TestOwnWaitRemove(t *testing.T) {
	c, ep := quietEcho(t)
	mineOf(t, c, ep)
	out := ownWaiting(t, c, context.Background(), nil, -1)
	c.Remove(ep)
	ended(t, "Remove", out)
	if d := c.Dead(nil); len(d) != 0 {
		t.Fatalf("dead: %v", d)
	}
	c.steps.mu.Lock()
	mine, hot, busy := c.steps.mine, len(c.steps.hot), c.steps.ownBusy
	c.steps.mu.Unlock()
	if mine != nil || hot != 0 || busy {
		t.Fatalf("mine %v hot %d busy %v", mine != nil, hot, busy)
	}
	if err := c.Send(ep, []byte("again")); err != nil {
		t.Fatal(err)
	}
	waitInbound(t, c, 1, 10*time.Second)
}

// Pings both ways while the waiter reads: the wait goes on to its limit,
// no one is declared silent.
func TestOwnWaitPings(t *testing.T) {
	s := newServer(t, ServerConfig{PingInterval: 10 * time.Millisecond, PeerTimeout: 200 * time.Millisecond})
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	c := newClient(t, ClientConfig{NoSameHost: true, PingInterval: 10 * time.Millisecond, PeerTimeout: 200 * time.Millisecond})
	ep := s.Endpoint()
	clientConn(t, c, ep)
	mineOf(t, c, ep)
	start := time.Now()
	out := ownWaiting(t, c, context.Background(), nil, time.Second)
	ended(t, "limit", out)
	if time.Since(start) < 900*time.Millisecond {
		t.Fatalf("ended after %v", time.Since(start))
	}
	if d := c.Dead(nil); len(d) != 0 {
		t.Fatalf("dead: %v", d)
	}
	c.Drain(nil)
	c.Send(ep, []byte("x"))
	waitInbound(t, c, 1, 10*time.Second)
}
