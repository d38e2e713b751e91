package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inPoller says whether any epoll set of this process watches the socket
// whose inode is ino (the kernel lists each set's entries in fdinfo).
func inPoller(t testing.TB, ino uint64) bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	want := fmt.Sprintf(" ino:%x ", ino)
	for _, e := range fds {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if strings.HasPrefix(line, "tfd:") && strings.Contains(line+" ", want) {
				return true
			}
		}
	}
	return false
}

// sockIno returns the inode of q's socket.
func sockIno(t testing.TB, q *quietConn) uint64 {
	t.Helper()
	var st unix.Stat_t
	var err error
	if cerr := (quietRaw{q}).Control(func(fd uintptr) { err = unix.Fstat(int(fd), &st) }); cerr != nil || err != nil {
		t.Fatalf("fstat: %v %v", cerr, err)
	}
	return st.Ino
}

// hotServerConn returns a server, a raw peer and the server's connection
// to it, hot and out of Go's poller.
func hotServerConn(t *testing.T, id string) (*Server, net.Conn, *guardConn, *quietConn) {
	t.Helper()
	return hotServerConnOn(t, newServer(t, ServerConfig{PingInterval: time.Hour}), id)
}

// patientServer keeps s's connections hot however long this goroutine is
// held off the CPU between Drains (a loaded machine): only a wait, a
// large frame or a failure cools them.
func patientServer(s *Server) { s.steps.patience.Store(int64(time.Minute)) }

// hotServerConnOn is hotServerConn on a given server.
func hotServerConnOn(t *testing.T, s *Server, id string) (*Server, net.Conn, *guardConn, *quietConn) {
	t.Helper()
	raw := rawHandshakeAs(t, s.Addr().String(), id)
	sg := serverConn(t, s, id)
	heat(t, sg, func() { raw.Write(envelope("warm")) }, func() { s.Drain(nil) })
	q := sg.Conn.(*quietConn)
	poll(t, 10*time.Second, "a detached connection", func() bool {
		s.Drain(nil)
		return q.detached.Load()
	})
	return s, raw, sg, q
}

// The rule: while a connection is hot, its socket is in no epoll set, so
// a message arriving wakes no thread; once cooled, the first read that
// waits puts it back, and what arrives then wakes the waiter.
func TestHotConnectionLeavesThePoller(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		hotConnectionLeavesThePoller(t, newServer(t, ServerConfig{PingInterval: time.Hour}))
	})
	t.Run("ipc", func(t *testing.T) {
		hotConnectionLeavesThePoller(t, newServerAt(t, "ipc://"+filepath.Join(t.TempDir(), "ctl.sock"), ServerConfig{PingInterval: time.Hour}))
	})
}

func hotConnectionLeavesThePoller(t *testing.T, s *Server) {
	patientServer(s)
	s, raw, sg, q := hotServerConnOn(t, s, "stepped")
	ino := sockIno(t, q)
	if inPoller(t, ino) {
		t.Fatal("a hot connection's socket is still in an epoll set")
	}
	raw.Write(envelope("read by a step"))
	var got []string
	poll(t, 10*time.Second, "the message read by Drain", func() bool {
		for _, m := range s.Drain(nil) {
			got = append(got, string(m.Payload))
		}
		return len(got) > 0 && got[len(got)-1] == "read by a step"
	})
	if inPoller(t, ino) {
		t.Fatal("reading in Drain put the socket back in an epoll set")
	}
	woke := make(chan bool, 1)
	go func() { woke <- s.Wait(context.Background()) }()
	poll(t, 10*time.Second, "the socket back in the poller", func() bool { return !sg.hot.Load() && inPoller(t, ino) })
	<-woke // a Wait may return early: the message is looked for below
	woke = make(chan bool, 1)
	go func() { woke <- s.Wait(context.Background()) }()
	raw.Write(envelope("read by the goroutine"))
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		t.Fatal("a message to a cooled connection did not wake Wait")
	}
	poll(t, 10*time.Second, "the message read by the goroutine", func() bool {
		m := s.Drain(nil)
		return len(m) == 1 && string(m[0].Payload) == "read by the goroutine"
	})
}

// readReply reads one message's last frame from a raw peer, skipping
// commands.
func readReply(t testing.TB, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	for {
		var h [9]byte
		if _, err := io.ReadFull(c, h[:2]); err != nil {
			t.Fatal(err)
		}
		size := uint64(h[1])
		if h[0]&flagLong != 0 {
			if _, err := io.ReadFull(c, h[2:9]); err != nil {
				t.Fatal(err)
			}
			size = binary.BigEndian.Uint64(h[1:9])
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatal(err)
		}
		if h[0]&(flagMore|flagCommand) == 0 {
			return body
		}
	}
}

// A detached connection still writes: small replies go out at once, and
// one larger than the socket takes waits for room in the poller (the
// connection attached again) and arrives whole; the connection is taken
// out again once no write waits.
func TestDetachedConnectionWrites(t *testing.T) {
	s := newServer(t, ServerConfig{PingInterval: time.Hour})
	patientServer(s)
	s, raw, sg, q := hotServerConnOn(t, s, "writes")
	if err := s.Reply([]byte("writes"), []byte("small")); err != nil {
		t.Fatal(err)
	}
	if got := readReply(t, raw); string(got) != "small" {
		t.Fatalf("got %q", got)
	}
	if !q.detached.Load() {
		t.Fatal("a write that did not wait attached the connection")
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: more than the socket takes
	if err := s.Reply([]byte("writes"), big); err != nil {
		t.Fatal(err)
	}
	if got := readReply(t, raw); !bytes.Equal(got, big) {
		t.Fatalf("the large reply arrived as %d bytes", len(got))
	}
	heat(t, sg, func() { raw.Write(envelope("warm")) }, func() { s.Drain(nil) })
	poll(t, 10*time.Second, "the connection detached again", func() bool {
		s.Drain(nil)
		return q.detached.Load()
	})
}

// Closing the server closes a detached connection's socket: the peer
// sees the end, and nothing of it is left open.
func TestClosingADetachedConnection(t *testing.T) {
	s, raw, _, q := hotServerConn(t, "closed")
	ino := sockIno(t, q)
	s.Close()
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, raw); err != nil {
		t.Fatalf("the peer saw %v, not the end", err)
	}
	if inPoller(t, ino) {
		t.Fatal("the closed socket is in an epoll set")
	}
	if q.Write([]byte("x")); !q.closed {
		t.Fatal("the connection is not closed")
	}
}

// An owner that holds Waiting (Serve, whose steps run where messages
// arrive) never heats a connection, however many Drains it makes.
func TestWaitingOwnerHeatsNothing(t *testing.T) {
	s := newServer(t, ServerConfig{PingInterval: time.Hour})
	done := serverHooks{s}.Waiting()
	defer done()
	raw := rawHandshakeAs(t, s.Addr().String(), "served")
	sg := serverConn(t, s, "served")
	n := 0
	for i := range 500 {
		raw.Write(envelope("m"))
		poll(t, 10*time.Second, "the message", func() bool {
			n += len(s.Drain(nil))
			return n > i
		})
		if sg.hot.Load() {
			t.Fatalf("hot after %d messages", i+1)
		}
	}
	if s.steps.taken.Load() != 0 {
		t.Fatalf("%d messages read in Drain", s.steps.taken.Load())
	}
}

// tcpPair returns a quietConn and its raw peer.
func tcpPair(t *testing.T) (*quietConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); acc <- c }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p := <-acc
	t.Cleanup(func() { c.Close(); p.Close() })
	return quietIO(c).(*quietConn), p
}

// The rule: a change of mode never fails a read or write in progress. A
// write that must not wait (a reply, a PING, a push, through the
// connection's RawConn) racing the detaches and attaches of a stepped
// connection always goes out.
func TestModeChangesFailNoWrite(t *testing.T) {
	q, peer := tcpPair(t)
	go io.Copy(io.Discard, peer)
	nb := newNBWriter(q)
	stop := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := nb.write([]byte("x")); err != nil {
				errc <- err
				return
			}
		}
	}()
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		q.detach() // as a Drain does
		q.mmu.Lock()
		if q.tc == nil && !q.closed {
			q.attachLocked() // as a read or write that waits does
		}
		q.mmu.Unlock()
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatalf("a write failed on a live connection: %v", err)
	}
}

// An owner that keeps stepping is not woken by the timer that cools its
// connections once it stops: each Drain pushes it back.
func TestSteppingOwnerTakesNoTimerWakeUps(t *testing.T) {
	// The rule holds for an owner that steps: a trial in which this
	// goroutine itself was held off the CPU for half the timer's period
	// (a loaded machine) did not step, and is tried again.
	for trial := 1; ; trial++ {
		s, raw, sg, _ := hotServerConn(t, "ticks")
		before := s.steps.checks.Load()
		var worst time.Duration
		last := time.Now()
		for end := last.Add(5 * coolAfter); last.Before(end); {
			s.Drain(nil)
			time.Sleep(200 * time.Microsecond) // an engine's step
			now := time.Now()
			worst = max(worst, now.Sub(last))
			last = now
		}
		if worst >= coolAfter/2 {
			if trial == 10 {
				t.Skipf("this goroutine never stepped every %v: once %v between steps", coolAfter/2, worst)
			}
			continue
		}
		if n := s.steps.checks.Load() - before; n > 0 || !sg.hot.Load() {
			t.Fatalf("%d checks by the timer over 5 of its periods, steps at most %v apart; hot: %v", n, worst, sg.hot.Load())
		}
		raw.Write(envelope("after the steps"))
		poll(t, 10*time.Second, "the connection cooled once the steps stopped", func() bool { return !sg.hot.Load() })
		if s.steps.checks.Load() == before {
			t.Fatal("cooled without the timer")
		}
		return
	}
}

// An owner that steps more slowly than stepsAtMost heats nothing: the
// timer would cool its connections before each next step, for a heat, a
// cool and no read per step.
func TestSlowSteppingOwnerHeatsNothing(t *testing.T) {
	s := newServer(t, ServerConfig{PingInterval: time.Hour})
	raw := rawHandshakeAs(t, s.Addr().String(), "slow")
	sg := serverConn(t, s, "slow")
	for i := range 20 {
		time.Sleep(stepsAtMost + time.Millisecond) // a slow engine's step
		raw.Write(envelope("m"))
		poll(t, 10*time.Second, "the message queued by the goroutine", func() bool { return len(s.in) > 0 })
		if got := s.Drain(nil); len(got) != 1 {
			t.Fatalf("step %d drained %d messages", i+1, len(got))
		}
		if sg.hot.Load() {
			t.Fatalf("hot after %d slow steps", i+1)
		}
	}
}
