package transport

import (
	"context"
	"os"
	"testing"
	"time"
)

// Every loop on a plane hears its signal: a second Producer or Pool on
// one TCPData (a session draining while its successor grants) adds its own
// ring, and the first's wait, which cannot see the ready channel while it
// sleeps, still ends on the signal.
func TestOnReadyRingsEveryLoopOnThePlane(t *testing.T) {
	d := &TCPData{ready: make(chan struct{}, 1), cready: make(chan struct{}, 1), sready: make(chan struct{}, 1)}
	s1 := newServer(t, ServerConfig{})
	s2 := newServer(t, ServerConfig{})
	// What NewProducer does (waitInOf), for the draining producer, then
	// for its successor.
	defer tcpPlane{d}.OnReady(false, serverHooks{s1}.Ring)()
	defer tcpPlane{d}.OnReady(false, serverHooks{s2}.Ring)()
	got := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		s1.waitIn(context.Background(), d.ready, 2*time.Second) // the first producer's loop
		got <- time.Since(start)
	}()
	poll(t, 10*time.Second, "a wait polling", func() bool { return s1.steps.pollers.Load() == 1 })
	time.Sleep(10 * time.Millisecond)
	signalled := time.Now()
	d.signal() // a READ of the first producer's grant ended
	took := <-got
	t.Logf("the first producer's wait returned %v after the signal", took-signalled.Sub(start))
	if took-signalled.Sub(start) > time.Second {
		t.Fatalf("the data plane's signal did not end the first producer's wait")
	}
}

// A Server's wait takes the wake it ends on: a request its connection's
// goroutine delivers both queues a wake and rings, and the next Wait does
// not return at once with nothing to Drain.
func TestServerWaitEmptyAfterDelivery(t *testing.T) {
	s := newServer(t, ServerConfig{PingInterval: time.Hour})
	raw := rawHandshakeAs(t, s.Addr().String(), "cold")
	defer raw.Close()
	serverConn(t, s, "cold")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 20
	empty, got := 0, 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for got < n && s.Wait(ctx) {
			m := s.Drain(nil)
			if len(m) == 0 {
				empty++
			}
			got += len(m)
		}
	}()
	for range n {
		// Slowly: the owner's Drains are too far apart to heat the
		// connection, which stays with its goroutine.
		time.Sleep(30 * time.Millisecond)
		raw.Write(envelope("req"))
	}
	<-done
	t.Logf("%d requests delivered by the goroutine; the owner's Wait returned %d times with nothing to Drain", got, empty)
	if empty > 2 {
		t.Fatalf("Wait returned %d times with nothing to Drain for %d requests: the kick each delivery leaves ends the next wait", empty, n)
	}
}

// Close frees the bell's descriptor, whether or not a wait is under way
// when it comes.
func TestWaitSetFreedByClose(t *testing.T) {
	count := func() int {
		fds, _ := os.ReadDir("/proc/self/fd")
		return len(fds)
	}
	before := count()
	for range 20 {
		c := NewClient(ClientConfig{Logger: quiet})
		c.waitIn(context.Background(), nil, time.Millisecond) // makes the bell's descriptor
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan bool)
		go func() { done <- c.Wait(ctx) }()
		poll(t, 10*time.Second, "a wait polling", func() bool { return c.steps.pollers.Load() == 1 })
		c.Close()
		if <-done {
			t.Fatal("Wait returned true on Close")
		}
		cancel()
		s, err := Listen("tcp://127.0.0.1:0", ServerConfig{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		s.waitIn(context.Background(), nil, time.Millisecond)
		s.Close()
	}
	time.Sleep(50 * time.Millisecond)
	if after := count(); after > before+2 {
		t.Fatalf("%d descriptors before, %d after 20 Clients and Servers that waited and closed", before, after)
	}
}

// An owner that never waits, and Drains every step, keeps a hot
// connection hot through the heartbeats its Drains read: they could wake
// no wait.
func TestNeverWaitingLoopKeepsHotThroughPing(t *testing.T) {
	s, raw, sg, _ := hotServerConn(t, "busy")
	patientServer(s)
	raw.Write(floodPing) // the peer's heartbeat
	for range 50 {
		s.Drain(nil) // the engine steps; it never waits
		time.Sleep(200 * time.Microsecond)
	}
	if !sg.hot.Load() {
		t.Fatal("a heartbeat read by a Drain cooled the connection of an owner that never waits")
	}
}
