package faultproxy

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves an echo on a free port until the test ends.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, within time.Duration) error {
	c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, 4))
	return err
}

func TestProxyFaults(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatalf("forwarding: %v", err)
	}
	p.Blackhole(true)
	var ne net.Error
	if err := roundTrip(c, 200*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("through a black hole: %v", err)
	}
	p.Blackhole(false) // the held bytes go through
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatalf("after the black hole: %v", err)
	}
	p.SetDelay(50 * time.Millisecond)
	start := time.Now()
	if err := roundTrip(c, 5*time.Second); err != nil || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("delayed round trip: %v after %v", err, time.Since(start))
	}
	p.SetDelay(0)
	p.Reset()
	if err := roundTrip(c, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("after a reset: %v", err)
	}
	p.Refuse(true)
	r, err := net.Dial("tcp", p.Addr())
	if err == nil {
		if err := roundTrip(r, 5*time.Second); err == nil {
			t.Fatal("a refused connection forwarded")
		}
		r.Close()
	}
}
