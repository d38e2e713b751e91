package transport

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// At ServerConfig.MaxConns a move sheds no one, not even the mover's own
// TCP connection (the one longest without a request): the same-host
// connection is refused, the consumer stays on TCP, and no live producer
// is declared dead.
func TestSameHostMoveShedsNotItsOwnTCP(t *testing.T) {
	for _, maxConns := range []int{1, 3} {
		t.Run(fmt.Sprint(maxConns), func(t *testing.T) {
			s := newServer(t, ServerConfig{MaxConns: maxConns})
			stop := make(chan struct{})
			defer close(stop)
			echo(t, s, stop)
			c := newClient(t, ClientConfig{})
			ep := s.Endpoint()
			deaths := 0
			for i := range 20 {
				if err := c.Send(ep, fmt.Appendf(nil, "m%d", i)); err != nil {
					t.Logf("send %d: %v", i, err)
				}
				end := time.Now().Add(2 * time.Second)
				got := 0
				for time.Now().Before(end) && got == 0 {
					got += len(c.Drain(nil))
					if d := c.Dead(nil); len(d) > 0 {
						deaths += len(d)
						t.Logf("round %d: death %v", i, d[0].Err)
						break
					}
					time.Sleep(100 * time.Microsecond)
				}
			}
			t.Logf("stats client %+v server %+v", c.Stats(), s.Stats())
			if deaths > 0 {
				t.Fatalf("%d deaths reported for a live producer (MaxConns %d, one same-host consumer)", deaths, maxConns)
			}
		})
	}
}

// MaxConns sized to the consumers (2 here): what fits over TCP alone
// fits with the move: a second consumer's move does not shed the first
// consumer's idle connection.
func TestSameHostMoveShedsNoNeighbour(t *testing.T) {
	for _, noSame := range []bool{true, false} {
		t.Run(fmt.Sprint("NoSameHost=", noSame), func(t *testing.T) {
			s := newServer(t, ServerConfig{MaxConns: 2})
			stop := make(chan struct{})
			defer close(stop)
			echo(t, s, stop)
			ep := s.Endpoint()
			a := newClient(t, ClientConfig{NoSameHost: noSame})
			a.Send(ep, []byte("a1"))
			waitInbound(t, a, 1, 5*time.Second)
			time.Sleep(20 * time.Millisecond)
			a.Send(ep, []byte("a2")) // moves (if it may)
			waitInbound(t, a, 1, 5*time.Second)
			b := newClient(t, ClientConfig{NoSameHost: noSame})
			for i := range 5 {
				b.Send(ep, fmt.Appendf(nil, "b%d", i))
				waitInbound(t, b, 1, 5*time.Second)
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			da, db := a.Dead(nil), b.Dead(nil)
			t.Logf("a %+v, b %+v, server %+v", a.Stats(), b.Stats(), s.Stats())
			if len(da)+len(db) > 0 {
				t.Fatalf("deaths: a %v, b %v", da, db)
			}
		})
	}
}

// A producer that proves its same-host socket and then fails the ZMTP
// handshake on it (a bad greeting, or a server refusing the connection at
// its cap): the client closes that connection at once, not at a GC.
func TestSameHostFailedHandshakeClosesItsConnection(t *testing.T) {
	eof := make(chan time.Duration, 1)
	p := newHostileProducer(t, func(c net.Conn, p *hostileProducer) {
		if !p.prove(c) {
			return
		}
		c.Write([]byte("this is not a ZMTP greeting, not at all.....................")) // 64 bytes
		start := time.Now()
		io.Copy(io.Discard, c) // until the client closes its end
		eof <- time.Since(start)
	})
	old := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(old)
	c := newClient(t, ClientConfig{HandshakeTimeout: time.Second})
	c.Send(p.ep(), []byte("a"))
	waitInbound(t, c, 1, 5*time.Second)
	t0 := time.Now()
	until(t, "the upgrade failed", func() bool { return c.Stats().SameHostFailed == 1 })
	t.Logf("upgrade failed after %v", time.Since(t0))
	select {
	case d := <-eof:
		t.Logf("closed after %v", d)
	case <-time.After(2 * time.Second):
		c.mu.Lock()
		d := c.peers[p.ep()]
		c.mu.Unlock()
		d.sockM.Lock()
		t.Logf("dealer: lconn %v lsock %v", d.lconn, d.lsock)
		d.sockM.Unlock()
		runtime.GC()
		select {
		case <-eof:
			t.Fatal("the client's same-host connection stayed open after its failed handshake until a GC closed it (finalizer)")
		case <-time.After(2 * time.Second):
			t.Fatal("the client's same-host connection stayed open after its failed handshake, even after a GC")
		}
	}
}

// Listen over a stale socket file takes a lock on the directory, which
// any process that can read the directory can hold: it waits a while
// for it, then fails with the address in use, never for ever.
func TestIPCListenWaitsForALockedDirectoryBriefly(t *testing.T) {
	dir := t.TempDir()
	stale := staleSocket(t, filepath.Join(dir, "stale.sock"))
	// Another process's lock (a separate open file description).
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		s, err := Listen("ipc://"+stale, ServerConfig{Logger: quiet})
		if err == nil {
			s.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("Listen: %v", err)
		}
	case <-time.After(staleLockWait + 5*time.Second):
		unix.Flock(fd, unix.LOCK_UN)
		unix.Close(fd)
		<-done
		t.Fatal("Listen over a stale file waited past its bound for a directory lock another process holds")
	}
	unix.Close(fd)
}

// Many goroutines sending across the move, the producer answering as it
// drains: every reply comes exactly once, none dropped, no death; per
// goroutine, replies in its send order. The second half of the sends
// waits until the socket is proven and the first half answered, so that
// each round moves, however late a loaded machine proves the socket.
func TestSameHostConcurrentSendsAcrossTheMove(t *testing.T) {
	moved := 0
	for round := range 20 {
		s := newServer(t, ServerConfig{})
		stop := make(chan struct{})
		served := echo(t, s, stop)
		c := newClient(t, ClientConfig{})
		ep := s.Endpoint()
		const G, N = 8, 40
		var wg sync.WaitGroup
		// The second half of every goroutine's sends waits until the
		// same-host socket is proven and every first-half request is
		// answered: the first of them moves, the others race it, however
		// late a loaded machine makes the upgrade.
		gate := make(chan struct{})
		for g := range G {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range N {
					if i == N/2 {
						<-gate
					}
					for c.Send(ep, fmt.Appendf(nil, "%d.%d", g, i)) != nil {
						time.Sleep(time.Millisecond)
					}
					if i%5 == 0 {
						time.Sleep(time.Duration(g*50) * time.Microsecond)
					}
				}
			}()
		}
		got := map[string]int{}
		last := make([]int, G)
		for i := range last {
			last[i] = -1
		}
		end := time.Now().Add(10 * time.Second)
		opened := false
		for len(got) < G*N && time.Now().Before(end) {
			if !opened && len(got) == G*N/2 && c.Stats().SameHost == 1 {
				close(gate)
				opened = true
			}
			for _, r := range c.Drain(nil) {
				got[string(r.Payload)]++
				var g, i int
				fmt.Sscanf(string(r.Payload), "re:%d.%d", &g, &i)
				if i <= last[g] {
					t.Errorf("round %d: %s after %d.%d", round, r.Payload, g, last[g])
				}
				last[g] = i
			}
			time.Sleep(50 * time.Microsecond)
		}
		if !opened {
			close(gate)
			wg.Wait()
			t.Fatalf("round %d: the same-host socket not proven in 10 s (%d of %d replies): %+v", round, len(got), G*N, c.Stats())
		}
		wg.Wait()
		for k, n := range got {
			if n != 1 {
				t.Errorf("round %d: %s %d times", round, k, n)
			}
		}
		if len(got) != G*N {
			t.Fatalf("round %d: %d of %d replies; dead %v; stats %+v", round, len(got), G*N, c.Dead(nil), c.Stats())
		}
		if d := c.Dead(nil); len(d) != 0 {
			t.Fatalf("dead %v", d)
		}
		c.mu.Lock()
		d := c.peers[ep]
		c.mu.Unlock()
		d.qmu.Lock()
		if d.moved {
			moved++
		}
		d.qmu.Unlock()
		close(stop)
		<-served
		c.Close()
		s.Close()
	}
	if moved != 20 {
		t.Fatalf("moved in %d of 20 rounds: a send with none unanswered, the socket proven, did not move", moved)
	}
}
