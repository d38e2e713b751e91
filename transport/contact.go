package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/xfer"
)

func init() {
	plane.Register(func(data any) any {
		switch d := data.(type) {
		case *TCPData:
			return tcpPlane{d}
		case *Server:
			return serverHooks{d}
		case *Client:
			return clientHooks{d}
		}
		return nil
	})
}

// Waiting implements plane.Waiter: the loop that waits may be the one
// that steps either side, so every connection its steps read, served
// (DrainNotifs) or to a producer (Step), goes back to its goroutine.
func (c tcpPlane) Waiting() (done func()) {
	c.d.steps.hold()
	c.d.links.hold()
	return c.d.waited
}

// Serving implements plane.Serving: the served connections alone, for a
// producer's Serve, whose goroutine steps no consumer.
func (c tcpPlane) Serving() (done func()) { return c.d.steps.wait() }

// ServeReady implements plane.Serving.
func (c tcpPlane) ServeReady() <-chan struct{} { return c.d.sready }

// Step implements plane.Stepped: the consumer's Drain of its connections
// to producers (see linkConn).
func (c tcpPlane) Step() { c.d.links.drain() }

// FailedWhy implements plane.Explainer.
func (c tcpPlane) FailedWhy(h xfer.Handle) error {
	c.d.mu.Lock()
	op := c.d.handles[h]
	c.d.mu.Unlock()
	if op == nil {
		return nil
	}
	return op.failedWhy()
}

// serverHooks are a Server's hooks for session/connector's Producer,
// which steps on the goroutine a request arrived on and waits on its data
// plane's signal and the control plane at once.
type serverHooks struct{ s *Server }

// WaitOr is Wait that also returns, true, when ready or timeout receives.
func (h serverHooks) WaitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool {
	return h.s.waitOr(ctx, ready, timeout)
}

// OnRequest sets f (nil: none) to run where each request is queued.
func (h serverHooks) OnRequest(f func()) { h.s.onRequestHook(f) }

// Wake makes the Wait in progress, or else the next one, return true.
func (h serverHooks) Wake() { h.s.wake() }

// Waiting implements plane.Waiter: Serve, whose steps run where requests
// arrive, holds it for its whole run, so that no connection is heated.
func (h serverHooks) Waiting() (done func()) { return h.s.steps.wait() }

// clientHooks are a Client's hooks for session/connector's Pool.
type clientHooks struct{ c *Client }

// WaitOr is Wait that also returns, true, when ready or timeout receives.
func (h clientHooks) WaitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool {
	return h.c.waitOr(ctx, ready, timeout)
}

// WaitOwn implements plane.OwnWaiter (see Client.waitOwn).
func (h clientHooks) WaitOwn(ctx context.Context, ready <-chan struct{}, d time.Duration) (woke, ok bool) {
	return h.c.waitOwn(ctx, ready, d)
}

// Interrupt implements plane.OwnWaiter.
func (h clientHooks) Interrupt() { h.c.steps.interrupt() }

// OnSignal implements plane.SignalHooked.
func (c tcpPlane) OnSignal(f func()) (remove func()) { return c.d.onSignal(f) }

// Pushes implements plane.SignalHooked: a producer may push.
func (c tcpPlane) Pushes() bool { return c.d.pushPeers.Load() > 0 }

// tcpPlane is a TCPData's side of the plumbing between a session and its
// data plane (package internal/plane).
type tcpPlane struct{ d *TCPData }

var (
	_ plane.Contacter         = tcpPlane{}
	_ plane.Explainer         = tcpPlane{}
	_ plane.Attacher          = tcpPlane{}
	_ plane.Signaling         = tcpPlane{}
	_ plane.ConsumerSignaling = tcpPlane{}
	_ plane.Stoppable         = tcpPlane{}
	_ plane.Named             = tcpPlane{}
	_ plane.Stepped           = tcpPlane{}
	_ plane.Waiter            = tcpPlane{}
	_ plane.Serving           = tcpPlane{}
	_ plane.SignalHooked      = tcpPlane{}
	_ plane.OwnWaiter         = clientHooks{}
)

// Attach implements plane.Attacher (see TCPData.attach).
func (c tcpPlane) Attach(g plane.Gate) plane.Attachment { return c.d.attach(g) }

// Ready implements plane.Signaling: it receives when a READ posted here
// ended or a notification arrived since the last receive, so that a step
// loop sleeps until there is something to do.
func (c tcpPlane) Ready() <-chan struct{} { return c.d.ready }

// ConsumerReady implements plane.ConsumerSignaling: Ready, for a Pool.
func (c tcpPlane) ConsumerReady() <-chan struct{} { return c.d.cready }

// StopsReads implements plane.Stoppable: Release stops every READ.
func (c tcpPlane) StopsReads() bool { return true }

// Name implements plane.Named: the agent name.
func (c tcpPlane) Name() string { return c.d.name }

// Contact implements plane.Contacter: every connection to the producer is
// brought up and has its welcome, so that the first READ pays for no
// connection, and a producer whose region this plane mapped has proven it
// is its own (before the proof, READs go over the socket) and had the
// mapping's pages faulted in. With a notification, a READ of no blocks
// under the producer's contact grant goes on the connection pushes come
// on: it ends the grant, and proves that connection to be the consumer
// session's, so that the first fetch's blocks may be pushed with its ack,
// as later ones' are; it comes last, after the mapping, so that the
// contact ends on a round trip with the producer (the first fetch over the
// same-host copy after it, in three alternating pairs of runs: 1.49-1.52
// times the steady p50, against 1.76-1.93 with the READ first). A touch page is not read: this plane's
// first READ does no set-up the contact has not done.
func (c tcpPlane) Contact(ctx context.Context, agent string, k plane.Contact) error {
	d := c.d
	d.mu.Lock()
	p := d.peers[agent]
	d.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	for _, l := range p.links {
		if err := c.contactLink(ctx, l); err != nil {
			return fmt.Errorf("transport: contact with %s: %w", p.name, err)
		}
	}
	if p.sh != nil && p.sh.verified.Load() { // else its pages are never populated
		select {
		case <-p.sh.populated:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if k.Notif != nil {
		return c.readNothing(ctx, agent, k.Notif)
	}
	return nil
}

// errNoWelcome fails a contact whose producer accepted the connection and
// did not answer its hello.
var errNoWelcome = errors.New("no welcome within the hello timeout")

// contactLink is l.contact, with the welcome bounded by the hello timeout from
// when the connection is up (the dial has DialTimeout). A connection whose
// welcome did not come is closed, so that nothing waits on it.
func (c tcpPlane) contactLink(ctx context.Context, l *link) error {
	if _, err := l.connect(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.d.cfg.helloTimeout(), errNoWelcome)
	defer cancel()
	err := l.contact(ctx)
	if err == nil || !errors.Is(context.Cause(ctx), errNoWelcome) {
		return err
	}
	l.mu.Lock()
	conn := l.conn
	l.mu.Unlock()
	if conn != nil {
		l.breakIf(conn, errNoWelcome)
	}
	return fmt.Errorf("%s: %w", l.p.addr, errNoWelcome)
}

// readNothing posts a READ of no blocks under notif's grant and waits for
// its end. One the producer refused (its grant gone) costs only the
// binding: the first fetch then goes without a push.
func (c tcpPlane) readNothing(ctx context.Context, agent string, notif []byte) error {
	h, err := c.d.PostRead(nil, agent, nil, notif)
	if err != nil {
		return fmt.Errorf("transport: contact READ: %w", err)
	}
	defer c.d.Release(h)
	c.d.mu.Lock()
	op := c.d.handles[h]
	c.d.mu.Unlock()
	// An answered READ ends by landing, which wakes us; a refused or
	// failed one is seen by Check, at pauses that double up to 50 ms, so
	// a producer that never answers costs no core.
	t := time.NewTimer(50 * time.Microsecond)
	defer t.Stop()
	for pause := 50 * time.Microsecond; ; pause = min(2*pause, 50*time.Millisecond) {
		c.d.contactChecks.Add(1)
		p, err := c.d.Check(h)
		if err != nil || p != xfer.InProgress {
			return err
		}
		t.Reset(pause)
		select {
		case <-op.landed:
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
