package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// quietPair returns both ends of a loopback TCP connection, each with
// quiet reads and writes.
func quietPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	a, b = quietIO(c), quietIO(s)
	if _, ok := a.(*quietConn); !ok {
		t.Fatalf("quietIO(%T) = %T", c, a)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestQuietConnStream moves more than the socket buffers hold both ways at
// once, so that writes are partial and reads wait, and checks every byte.
func TestQuietConnStream(t *testing.T) {
	a, b := quietPair(t)
	const size = 16 << 20
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i*7 + i>>13)
	}
	errs := make(chan error, 2)
	for _, w := range []net.Conn{a, b} {
		go func() {
			n, err := w.Write(src)
			if err == nil && n != size {
				err = io.ErrShortWrite
			}
			errs <- err
		}()
	}
	for _, r := range []net.Conn{b, a} {
		got := make([]byte, size)
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src) {
			t.Fatal("bytes differ")
		}
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestQuietConnEnds checks the ways a read or write ends as net.Conn's do:
// the peer's close is io.EOF after its bytes, a deadline is a timeout, our
// close is net.ErrClosed, a reset is the errno.
func TestQuietConnEnds(t *testing.T) {
	t.Run("eof", func(t *testing.T) {
		a, b := quietPair(t)
		b.Write([]byte("last"))
		b.Close()
		got, err := io.ReadAll(a)
		if err != nil || string(got) != "last" {
			t.Fatalf("ReadAll = %q, %v", got, err)
		}
		if n, err := a.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("Read after EOF = %d, %v", n, err)
		}
	})
	t.Run("read deadline", func(t *testing.T) {
		a, _ := quietPair(t)
		a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := a.Read(make([]byte, 1))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read = %v, want a timeout", err)
		}
	})
	t.Run("write deadline", func(t *testing.T) {
		a, _ := quietPair(t)        // the peer never reads
		buf := make([]byte, 64<<20) // more than both sockets' buffers hold
		// Long enough that a loaded machine still writes before it.
		a.SetWriteDeadline(time.Now().Add(250 * time.Millisecond))
		n, err := a.Write(buf)
		if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n >= len(buf) {
			t.Fatalf("Write = %d, %v; want part written, then a timeout", n, err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		a, _ := quietPair(t)
		a.Close()
		if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read = %v", err)
		}
		if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write = %v", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		a, b := quietPair(t)
		b.(*quietConn).SetLinger(0)
		b.Close() // RST
		_, err := a.Read(make([]byte, 1))
		var oe *net.OpError
		if !errors.Is(err, syscall.ECONNRESET) || !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("Read = %v, want ECONNRESET", err)
		}
	})
	t.Run("not tcp", func(t *testing.T) {
		p, q := net.Pipe()
		defer p.Close()
		defer q.Close()
		if got := quietIO(p); got != p {
			t.Fatalf("quietIO(pipe) = %T", got)
		}
	})
}
