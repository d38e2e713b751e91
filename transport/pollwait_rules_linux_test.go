package transport

import (
	"context"
	"encoding/binary"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
	"golang.org/x/sys/unix"
)

// fakeHot is a stepConn whose bytes arrive on an eventfd, pollable as a
// hot connection's socket is.
type fakeHot struct {
	fd     int
	hot    atomic.Bool
	heated atomic.Bool // ever
}

func (f *fakeHot) readNow([]byte) bool {
	var v [8]byte
	unix.Read(f.fd, v[:])
	return true
}
func (f *fakeHot) setHot(on bool) bool {
	f.hot.Store(on)
	if on {
		f.heated.Store(true)
	}
	return true
}
func (f *fakeHot) wake()       {}
func (f *fakeHot) pollFD() int { return f.fd }

type noSource struct{}

func (noSource) pending() bool         { return false }
func (noSource) gone() <-chan struct{} { return nil }

// A connection heated by its goroutine just as its owner's wait begins
// is watched by that wait: heat decides whether to ring under mu, after
// adding the connection, and the wait counts itself before it arms the hot
// set under mu, so either the wait arms it or heat rings. GOMAXPROCS=1
// makes the interleaving likely: the goroutine woken by the Drain's Unlock
// runs only once the owner parks in its wait.
func TestHeatWhileAWaitBeginsIsWatched(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var st stepReads
	st.patience.Store(int64(time.Minute)) // no timer cools it meanwhile
	defer func() {
		st.mu.Lock()
		if st.timer != nil {
			st.timer.Stop()
		}
		st.mu.Unlock()
		st.bell.close()
	}()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	fc := &fakeHot{fd: efd}

	// The owner steps: two Drains in a row, so heat's rule holds.
	st.drained()
	st.drained()
	st.mu.Lock() // a Drain under way, as Client.Drain / Server.Drain hold it
	go st.heat(fc)
	for range 10 {
		runtime.Gosched() // the goroutine: pollers == 0, then it waits for mu
	}
	// A message arrives on the connection a while after the wait began.
	var wrote atomic.Int64
	go func() {
		time.Sleep(50 * time.Millisecond)
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		unix.Write(efd, one[:])
		wrote.Store(monoNow())
	}()
	st.mu.Unlock() // the Drain ends; the owner goes on to wait at once
	start := time.Now()
	woke, handled := st.pollWait(context.Background(), nil, 2*time.Second, noSource{})
	took := time.Since(start)
	st.mu.Lock()
	inHot := len(st.hot) == 1
	st.mu.Unlock()
	t.Logf("pollWait: woke=%v handled=%v after %v; connection hot: %v", woke, handled, took, inHot)
	if !handled || !inHot {
		t.Fatalf("the wait was not polled (%v) or the connection not heated (%v)", handled, inHot)
	}
	if took > time.Second {
		t.Fatalf("a message on a connection heated while the wait began did not wake it: it slept %v, to its limit (lost wake-up)", took)
	}
}

// An idle owner waiting with no limit sleeps through heartbeats: a Drain
// that read only commands from a hot connection cools it, and its
// goroutine reads them from then on, so that an idle Pool or Producer
// steps for no heartbeat.
func TestIdleWaitSleepsThroughHeartbeats(t *testing.T) {
	for _, side := range []string{"client", "server"} {
		t.Run(side, func(t *testing.T) {
			const ping = 20 * time.Millisecond
			s := newServer(t, ServerConfig{PingInterval: ping, PeerTimeout: time.Minute})
			c := newClient(t, ClientConfig{PingInterval: ping, PeerTimeout: time.Minute})
			if err := c.Connect(context.Background(), s.Endpoint()); err != nil {
				t.Fatal(err)
			}
			// One round trip: both connections carry messages from now on.
			if err := c.Send(s.Endpoint(), []byte("hello")); err != nil {
				t.Fatal(err)
			}
			var req []xfer.Message
			for end := time.Now().Add(10 * time.Second); len(req) == 0; time.Sleep(100 * time.Microsecond) {
				if req = s.Drain(req); time.Now().After(end) {
					t.Fatal("no request")
				}
			}
			if err := s.Reply(req[0].Identity, []byte("hi")); err != nil {
				t.Fatal(err)
			}
			waitInbound(t, c, 1, 10*time.Second)
			wait := func(ctx context.Context) (bool, int) {
				if side == "client" {
					w := c.Wait(ctx)
					return w, len(c.Drain(nil)) + len(c.Dead(nil))
				}
				w := s.Wait(ctx)
				return w, len(s.Drain(nil))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			empty := 0
			for {
				woke, n := wait(ctx)
				if !woke {
					break
				}
				if n == 0 {
					empty++
				}
			}
			t.Logf("%s: an idle Wait (no limit) returned true %d times in 1 s with nothing to Drain (ping interval %v)", side, empty, ping)
			if empty > 2 {
				t.Fatalf("%s: an idle Wait returned %d times with nothing to Drain: heartbeats wake the owner", side, empty)
			}
		})
	}
}

// qHot is a hot connection over a real quietConn: pollWait polls its
// descriptor as it polls a guardConn's.
type qHot struct{ q *quietConn }

func (h qHot) readNow([]byte) bool { return true }
func (h qHot) setHot(bool) bool    { return true }
func (h qHot) wake()               {}
func (h qHot) pollFD() int         { return h.q.pollFD() }

// A wait follows a hot connection's socket, not its number: a write that
// must wait for room attaches the connection again while its owner waits
// (its detached number closed, and taken by the next file the process
// makes), and a message on it still ends the wait, since each change of
// the descriptor rings the wait, which then polls the new one.
func TestWaitFollowsTheSocketNotItsNumber(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	peer.(*net.TCPConn).SetReadBuffer(4096)
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc.(*net.TCPConn).SetWriteBuffer(4096)
	q := quietIO(sc).(*quietConn)
	defer q.Close()
	if _, err := q.tryRead(make([]byte, 64)); err != errNothing || !q.detached.Load() {
		t.Fatalf("tryRead: %v, detached %v", err, q.detached.Load())
	}
	n1 := q.pollFD()

	var st stepReads
	defer st.bell.close()
	q.moved = st.ring // as newGuardConn wires it
	st.hot = []stepConn{qHot{q}}
	st.timer = time.AfterFunc(time.Hour, func() {}) // as heat made it
	defer st.timer.Stop()
	type res struct {
		woke bool
		took time.Duration
	}
	got := make(chan res, 1)
	go func() {
		start := time.Now()
		woke, _ := st.pollWait(context.Background(), nil, 3*time.Second, noSource{})
		got <- res{woke, time.Since(start)}
	}()
	poll(t, 10*time.Second, "a wait polling", func() bool { return st.pollers.Load() == 1 })
	time.Sleep(20 * time.Millisecond) // asleep in ppoll on n1

	// The guard's writer: more than the socket takes; it waits for room,
	// attaching the connection (its number n1 closed, another made).
	go q.Write(make([]byte, 8<<20))
	poll(t, 10*time.Second, "the connection attached by the write", func() bool { return !q.detached.Load() })
	if q.pollFD() == n1 {
		t.Fatal("the number did not change")
	}
	// Anything the process opens next may take n1.
	var extra []int
	defer func() {
		for _, fd := range extra {
			unix.Close(fd)
		}
	}()
	reused := false
	for range 64 {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		extra = append(extra, fd)
		if fd == n1 {
			reused = true
			break
		}
	}
	if !reused {
		t.Skipf("number %d not reused", n1)
	}
	// A message for the owner arrives on its hot connection.
	sent := time.Now()
	if _, err := peer.Write([]byte("a reply")); err != nil {
		t.Fatal(err)
	}
	r := <-got
	t.Logf("pollWait: woke=%v after %v; the message came %v into it", r.woke, r.took, time.Since(sent))
	if time.Since(sent) > time.Second {
		t.Fatalf("a message on a hot connection did not end the wait: it polled fd %d, closed by an attach and now an eventfd, and slept to its limit", n1)
	}
}

// Two waits at once on one Client each end on their own causes: one
// polls, the other waits on its channels (the bell's ring is taken by
// whichever wait wakes first, so only one may poll).
func TestConcurrentWaitsEachEnd(t *testing.T) {
	for _, what := range []string{"context", "close"} {
		t.Run(what, func(t *testing.T) {
			lost := 0
			const trials = 20
			for range trials {
				c := newClient(t, ClientConfig{})
				bg, stopB := context.WithCancel(context.Background())
				actx, cancelA := context.WithCancel(context.Background())
				a, b := make(chan bool, 1), make(chan bool, 1)
				go func() { a <- c.Wait(actx) }()
				go func() { b <- c.Wait(bg) }()
				poll(t, 10*time.Second, "one wait polling, one on its channels", func() bool {
					c.steps.mu.Lock()
					defer c.steps.mu.Unlock()
					return c.steps.pollers.Load() == 1 && c.steps.waiters == 1
				})
				time.Sleep(5 * time.Millisecond) // both asleep
				if what == "context" {
					cancelA()
				} else {
					c.Close()
				}
				aDone, bDone := false, false
				select {
				case <-a:
					aDone = true
				case <-time.After(time.Second):
					lost++
				}
				if what == "close" {
					select {
					case <-b:
						bDone = true
					case <-time.After(time.Second):
						lost++
					}
				}
				// Unstick whatever still sleeps.
				cancelA()
				stopB()
				c.Close()
				for i, ch := range []chan bool{a, b} {
					if []bool{aDone, bDone}[i] {
						continue
					}
					select {
					case <-ch:
					case <-time.After(10 * time.Second):
						t.Fatalf("wait %c never ended, even after Close (pollers %d)", "ab"[i], c.steps.pollers.Load())
					}
				}
			}
			t.Logf("%s: %d of %d ends lost", what, lost, trials)
			if lost > 0 {
				t.Fatalf("%s: %d waits of %d trials did not end when they should have", what, lost, trials)
			}
		})
	}
}
