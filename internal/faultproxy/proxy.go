// Package faultproxy is a TCP proxy for tests that injects the faults of a
// real network between two endpoints: latency, a bandwidth limit, resets
// (RST, not FIN) and black holes (the proxy stops forwarding and keeps the
// connections open, as a partition or a dead switch does).
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards every connection it accepts to its target.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond // signalled when the black hole lifts or the proxy closes
	delay  time.Duration
	rate   int // bytes per second each way per connection; 0: unlimited
	hole   bool
	refuse bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// New listens on a free loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's address ("127.0.0.1:port").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay delays every chunk forwarded by d (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// SetRate limits each direction of each connection to bytesPerSec (0:
// unlimited).
func (p *Proxy) SetRate(bytesPerSec int) {
	p.mu.Lock()
	p.rate = bytesPerSec
	p.mu.Unlock()
}

// Blackhole stops (true) or resumes (false) forwarding. Connections stay
// open and new ones are accepted but not forwarded: bytes pile up in the
// kernel's buffers, as behind a partition.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	p.hole = on
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Refuse makes the proxy reset new connections at once (true), as a host
// with nothing listening does.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Reset aborts every open connection with a RST on both sides.
func (p *Proxy) Reset() {
	p.mu.Lock()
	for c := range p.conns {
		abort(c)
	}
	p.mu.Unlock()
}

// Close stops the proxy, resets its connections and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cond.Broadcast()
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	return err
}

func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		abort(c)
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			abort(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(in net.Conn) {
	defer p.wg.Done()
	if !p.track(in) {
		return
	}
	defer p.untrack(in)
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		abort(in)
		return
	}
	if !p.track(out) {
		abort(in)
		return
	}
	defer p.untrack(out)
	done := make(chan bool, 2)
	p.wg.Add(2)
	go func() { defer p.wg.Done(); done <- p.pipe(out, in) }()
	go func() { defer p.wg.Done(); done <- p.pipe(in, out) }()
	if eof := <-done; !eof {
		// Reset or failed: end the other way the same (a reset stays a
		// reset).
		abort(in)
		abort(out)
	}
	<-done
	in.Close()
	out.Close()
}

// pipe copies src to dst, applying the faults in force. It reports whether
// src ended cleanly (then dst's write side is closed: the FIN passes on).
func (p *Proxy) pipe(dst, src net.Conn) (eof bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.hole && !p.closed {
				p.cond.Wait()
			}
			closed, delay, rate := p.closed, p.delay, p.rate
			p.mu.Unlock()
			if closed {
				return false
			}
			if rate > 0 {
				delay += time.Duration(n) * time.Second / time.Duration(rate)
			}
			if delay > 0 {
				time.Sleep(delay)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return false
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
				return true
			}
			return false
		}
	}
}
