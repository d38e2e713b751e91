package transport

import (
	"context"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// goroutines returns the stacks of every goroutine but the caller's, by id.
func goroutines() map[string]string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	out := map[string]string{}
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 {
			continue // the caller
		}
		id, _, _ := strings.Cut(g, " [")
		out[id] = g
	}
	return out
}

// leftover fails, at once, for every goroutine this package started since
// base and blocked (on I/O, a channel, a timer...) after Close; a runnable
// one gets 5 s, for one whose deferred wg.Done let Close return and which
// is listed until it has returned (CI caught one at its closing brace; a
// loaded machine may hold it off the CPU for tens of milliseconds). One
// that blocks meanwhile fails at once; one that never stops, at 5 s.
// Then, with goleak's retries, it fails for every other goroutine (zmq4's,
// which its Close does not wait for, exit within microseconds once ours
// are done).
func leftover(t *testing.T, base map[string]string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var exiting []string
		for id, g := range goroutines() {
			if _, ok := base[id]; ok || !strings.Contains(g, "created by github.com/ecxfer/ecxfer/transport.") {
				continue
			}
			if strings.Contains(g, " [runnable]:") || strings.Contains(g, " [running]:") {
				exiting = append(exiting, g)
			} else {
				t.Errorf("goroutine alive after Close:\n%s", g)
			}
		}
		if t.Failed() || len(exiting) == 0 {
			break
		}
		if time.Now().After(end) {
			for _, g := range exiting {
				t.Errorf("goroutine still running 5 s after Close:\n%s", g)
			}
			break
		}
	}
	goleak.VerifyNone(t, baseOpt)
}

// baseOpt is goleak's view of the goroutines alive when the test began.
var baseOpt goleak.Option

// Close returns only once every goroutine the control
// plane and the TCP data plane started has stopped: none may be left even
// a moment after, whatever peers did (a request answered, a half-open
// handshake, a peer gone silent).
func TestCloseStopsEveryGoroutine(t *testing.T) {
	base := goroutines()
	baseOpt = goleak.IgnoreCurrent()
	s, err := Listen("tcp://127.0.0.1:0", ServerConfig{Logger: quiet, PingInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(ClientConfig{Logger: quiet, PingInterval: 10 * time.Millisecond})
	stop := make(chan struct{})
	served := echo(t, s, stop)
	if err := c.Send(s.Endpoint(), []byte("hi")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for got := 0; got == 0; {
		if !c.Wait(ctx) {
			t.Fatal("no reply")
		}
		got = len(c.Drain(nil))
	}
	// A raw TCP peer that never completes the ZMTP handshake, and one that
	// sends half a greeting.
	raw1, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw1.Close()
	raw2, _ := net.Dial("tcp", s.Addr().String())
	defer raw2.Close()
	raw2.Write([]byte{0xff, 0, 0, 0})
	// A client whose producer never answers the handshake.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	c.Send("tcp://"+ln.Addr().String(), []byte("x"))
	time.Sleep(30 * time.Millisecond) // let heartbeats and handshakes start

	close(stop)
	<-served

	c.Close()

	s.Close()
	leftover(t, base)

	// The TCP data plane likewise.
	cr, pr := newRegion(t, 4, 64), newRegion(t, 4, 64)
	p, _ := NewTCPData(TCPConfig{Listen: "127.0.0.1:0", Logger: quiet, Authorize: allowAll}, pr)
	cd, _ := NewTCPData(TCPConfig{Logger: quiet}, cr)
	peer, _ := cd.AddRemotePeer(p.AgentMetadata(), nil)
	h, _ := cd.PostRead([]int{0}, peer.Agent, []int{1}, []byte("s:h"))
	waitEnd(t, cd, h)
	cd.Close()
	p.Close()
	leftover(t, base)
}
