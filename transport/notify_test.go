package transport

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/wake"
	"github.com/ecxfer/ecxfer/xfer"
)

// TestClientOnReply: a loop that sleeps on a wake.Waiter, woken only by
// OnReply, sees every reply with Drain and a death with Dead, and after
// stop the function is no longer called.
func TestClientOnReply(t *testing.T) {
	s := newServer(t, ServerConfig{})
	done := make(chan struct{})
	defer close(done)
	echo(t, s, done)
	c := newClient(t, ClientConfig{ConnectTimeout: 500 * time.Millisecond})
	w := wake.New()
	defer w.Close()
	var calls atomic.Int32
	stop := c.OnReply(func() { calls.Add(1); w.Wake() })
	const n = 50
	for range n {
		if err := c.Send(s.Endpoint(), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	var got []Inbound
	for len(got) < n && time.Now().Before(deadline) {
		w.Wait(time.Second) // a missed call shows in the counts below
		got = c.Drain(got)
	}
	// A call follows its reply, which Drain may take first.
	for calls.Load() < n && time.Now().Before(deadline) {
		w.Wait(time.Second)
	}
	if len(got) != n || calls.Load() != n {
		t.Fatalf("%d replies, %d calls; want %d", len(got), calls.Load(), n)
	}
	dead := "tcp://127.0.0.1:1" // nothing listens: declared dead
	if err := c.Send(dead, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var deaths []string
	for len(deaths) == 0 && time.Now().Before(deadline.Add(10*time.Second)) {
		w.Wait(time.Second)
		deaths = c.Dead(deaths)
	}
	for calls.Load() < n+1 && time.Now().Before(deadline.Add(10*time.Second)) {
		w.Wait(time.Second)
	}
	if len(deaths) != 1 || deaths[0] != dead || calls.Load() != n+1 {
		t.Fatalf("deaths %v, calls %d", deaths, calls.Load())
	}
	stop()
	if err := c.Send(s.Endpoint(), []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitInbound(t, c, 1, 10*time.Second)
	if calls.Load() != n+1 {
		t.Fatalf("called after stop: %d", calls.Load())
	}
}

// TestTCPOnReady: a consumer that sleeps only on what OnReady wakes sees
// its READ end, and a producer sees the notification, each after a wake
// (a missing call would leave the Wait to its 10 s timeout).
func TestTCPOnReady(t *testing.T) {
	cr, pr := newRegion(t, 8, 64), newRegion(t, 8, 64)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll, NoPush: true})
	c := newTCP(t, cr, TCPConfig{})
	cw, pw := wake.New(), wake.New()
	defer cw.Close()
	defer pw.Close()
	var ccalls, pcalls atomic.Int32
	stopC := c.OnReady(func() { ccalls.Add(1); cw.Wake() })
	defer stopC()
	defer p.OnReady(func() { pcalls.Add(1); pw.Wake() })()
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	copy(pr.Block(5), "ready")
	h, err := c.PostRead([]int{1}, peer.Agent, []int{5}, []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	sleep := func(w *wake.Waiter) {
		start := time.Now()
		w.Wait(10 * time.Second)
		if time.Since(start) >= 10*time.Second {
			t.Fatal("no wake within 10 s")
		}
	}
	for {
		st, err := c.Check(h)
		if err != nil {
			t.Fatal(err)
		}
		if st == xfer.Complete {
			break
		}
		if st != xfer.InProgress {
			t.Fatalf("READ ended %v", st)
		}
		sleep(cw)
	}
	// The call comes once the READ's end can be seen: it may follow the
	// Check that saw it.
	for ccalls.Load() == 0 {
		sleep(cw)
	}
	if !bytes.HasPrefix(cr.Block(1), []byte("ready")) {
		t.Fatalf("block %q", cr.Block(1))
	}
	var n []xfer.Notif
	for len(n) == 0 {
		if n, err = p.DrainNotifs(n); err != nil {
			t.Fatal(err)
		}
		if len(n) == 0 {
			sleep(pw)
		}
	}
	for pcalls.Load() == 0 { // as above
		sleep(pw)
	}
	if string(n[0].Msg) != "n" {
		t.Fatalf("notifs %+v", n)
	}
}
