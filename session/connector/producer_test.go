package connector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// memServer is an in-memory control server.
type memServer struct {
	mu      sync.Mutex
	in      []xfer.Message
	replies map[string][][]byte
	closed  bool // Wait returns false at once, as a closed transport.Server does
}

func (m *memServer) push(msg xfer.Message) {
	m.mu.Lock()
	m.in = append(m.in, msg)
	m.mu.Unlock()
}

func (m *memServer) replyTo(id string) [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.replies[id])
}

func (m *memServer) Drain(dst []xfer.Message) []xfer.Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	dst = append(dst, m.in...)
	m.in = nil
	return dst
}
func (m *memServer) Reply(id, p []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.replies[string(id)] = append(m.replies[string(id)], bytes.Clone(p))
	return nil
}
func (m *memServer) Wait(ctx context.Context) bool {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if !closed {
		<-ctx.Done()
	}
	return false
}

func uuidN(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// A flood of requests from one consumer under many session ids pins no
// more than the bound and does not delay another consumer's grant by more
// than one step.
func TestProducerFloodFairness(t *testing.T) {
	c := cache.NewEmbeddingCache(64) // the grant bound binds first, not the pinned share
	for _, h := range []string{"A", "B"} {
		c.Alloc(h, 1)
		c.MarkReady(h)
	}
	srv := &memServer{replies: map[string][][]byte{}}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, MaxRequestsPerStep: 100, MaxPerPeerPerStep: 10, MaxGrants: 50, MaxPinnedShare: 1},
		srv, xfake.New("prod", 16, 8), c))
	for i := range 1000 {
		srv.in = append(srv.in, xfer.Message{Identity: []byte("flood"),
			Payload: wire.AppendReq(nil, &wire.XferReq{MMHash: "A", CompatibilityHash: compat, SessionID: uuidN(i)})})
	}
	srv.in = append(srv.in, xfer.Message{Identity: []byte("honest"),
		Payload: wire.AppendReq(nil, &wire.XferReq{MMHash: "B", CompatibilityHash: compat, SessionID: uuidN(99999)})})
	p.Step(t0)
	if len(srv.replies["honest"]) != 1 {
		t.Fatalf("the honest consumer got %d replies in the first step", len(srv.replies["honest"]))
	}
	var a wire.XferAck
	wire.DecodeAck(srv.replies["honest"][0], &a)
	if a.Status != wire.OK {
		t.Fatalf("honest consumer: %s", a.Status)
	}
	if n := len(srv.replies["flood"]); n != 10 {
		t.Fatalf("flood got %d replies in a step, want 10", n)
	}
	for range 200 {
		p.Step(t0)
	}
	e, _ := c.Get("A")
	if len(srv.replies["flood"]) != 1000 || e.Pins != 49 || p.Stats().OverBound != 951 {
		t.Fatalf("replies %d, pins %d, refused %d", len(srv.replies["flood"]), e.Pins, p.Stats().OverBound)
	}
	if waiting, _ := p.Backlog(); waiting != 0 {
		t.Fatalf("%d left waiting", waiting)
	}
}

func TestProducerBacklogBound(t *testing.T) {
	srv := &memServer{replies: map[string][][]byte{}}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, MaxPerPeerPerStep: 1, MaxBacklog: 10},
		srv, xfake.New("prod", 16, 8), cache.NewEmbeddingCache(16)))
	for range 30 {
		srv.in = append(srv.in, xfer.Message{Identity: []byte("x"), Payload: []byte{0x80}})
	}
	p.Step(t0)
	if waiting, dropped := p.Backlog(); waiting != 9 || dropped != 20 {
		t.Fatalf("waiting %d dropped %d", waiting, dropped)
	}
}

func TestProducerServeStops(t *testing.T) {
	srv := &memServer{replies: map[string][][]byte{}}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv, xfake.New("prod", 16, 8), cache.NewEmbeddingCache(16)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := p.Serve(ctx); err == nil {
		t.Fatal("Serve returned nil")
	}
	if err := p.Close(); err != nil || p.Grants() != 0 {
		t.Fatalf("close: %v, %d grants left", err, p.Grants())
	}
}

// Close stops a running Serve, and a closed control plane
// ends Serve instead of spinning on a Wait that returns at once.
func TestProducerCloseStopsServe(t *testing.T) {
	srv := &memServer{replies: map[string][][]byte{}}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv, xfake.New("prod", 16, 8), cache.NewEmbeddingCache(16)))
	done := make(chan error)
	go func() { done <- p.Serve(context.Background()) }()
	p.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after Close: %v", err)
	}

	srv2 := &memServer{replies: map[string][][]byte{}, closed: true}
	p2 := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv2, xfake.New("prod", 16, 8), cache.NewEmbeddingCache(16)))
	if err := p2.Serve(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve on a closed control plane: %v", err)
	}
}

// Shutdown stops granting, lets the live grant end through
// its notification, then closes; nothing is unpinned under a READ.
func TestProducerShutdown(t *testing.T) {
	c := cache.NewEmbeddingCache(16)
	c.Alloc("A", 1)
	c.MarkReady("A")
	data := xfake.New("prod", 16, 8)
	srv := &memServer{replies: map[string][][]byte{}}
	clock := t0
	var clockMu sync.Mutex
	now := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, Now: now}, srv, data, c))
	reqA := func(n int) xfer.Message {
		return xfer.Message{Identity: []byte("c"), Payload: wire.AppendReq(nil, &wire.XferReq{MMHash: "A", CompatibilityHash: compat, SessionID: uuidN(n)})}
	}
	srv.push(reqA(1))
	p.Step(now())
	if p.Grants() != 1 {
		t.Fatal("no grant")
	}
	done := make(chan error)
	go func() { done <- p.Shutdown(context.Background()) }()
	srv.push(reqA(2))
	for len(srv.replyTo("c")) < 2 {
		time.Sleep(time.Millisecond) // Shutdown's steps answer it
	}
	var a wire.XferAck
	wire.DecodeAck(srv.replyTo("c")[1], &a)
	if a.Status != wire.NackInternal {
		t.Fatalf("request while shutting down: %s", a.Status)
	}
	if e, _ := c.Get("A"); e.Pins != 1 {
		t.Fatalf("pins while shutting down: %d", e.Pins)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned with a grant live: %v", err)
	default:
	}
	data.InjectNotif("cons", []byte(uuidN(1)+":A"))
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if e, _ := c.Get("A"); e.Pins != 0 || p.Stats().Completions != 1 {
		t.Fatalf("after Shutdown: pins %d", e.Pins)
	}

	// A grant whose notification never comes: the context ends the
	// shutdown.
	c2 := cache.NewEmbeddingCache(16)
	c2.Alloc("A", 1)
	c2.MarkReady("A")
	srv2 := &memServer{replies: map[string][][]byte{}}
	p2 := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, Now: func() time.Time { return t0 }}, srv2, xfake.New("prod", 16, 8), c2))
	srv2.push(reqA(3))
	p2.Step(t0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := p2.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "grants left: 1") {
		t.Fatalf("Shutdown past its context: %v", err)
	}
	// A data plane that lets any peer READ (as NIXL): the READ may still
	// run, so the pin stays until the lease, which later steps end.
	if e, _ := c2.Get("A"); e.Pins != 1 {
		t.Fatalf("pins %d after Close: the grant's READ may still run", e.Pins)
	}
	p2.Step(t0.Add(time.Minute))
	if e, _ := c2.Get("A"); e.Pins != 0 || p2.Grants() != 0 {
		t.Fatal("pin leaked past the lease")
	}
}

// inlineServer is a memServer whose requests arrive through OnRequest,
// as transport.Server's do, and whose WaitOr reports when it parks.
type inlineMemServer struct {
	memServer
	hook    func()
	hookSet chan struct{}
	parked  chan struct{}
	kick    chan struct{}
	wakes   int
}

func (m *inlineMemServer) OnRequest(f func()) {
	m.mu.Lock()
	m.hook = f
	m.mu.Unlock()
	if f != nil {
		m.hookSet <- struct{}{}
	}
}

func (m *inlineMemServer) Wake() {
	m.mu.Lock()
	m.wakes++
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *inlineMemServer) WaitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool {
	m.parked <- struct{}{}
	select {
	case <-m.kick:
	case <-ready:
	case <-timeout:
	case <-ctx.Done():
		return false
	}
	return true
}

// inlineWorld is a cache holding ready entry "A" (one block) and an
// inline control plane.
func inlineWorld() (*cache.EmbeddingCache, *inlineMemServer) {
	c := cache.NewEmbeddingCache(16)
	c.Alloc("A", 1)
	c.MarkReady("A")
	return c, &inlineMemServer{memServer: memServer{replies: map[string][][]byte{}},
		hookSet: make(chan struct{}, 1), parked: make(chan struct{}), kick: make(chan struct{}, 1)}
}

// arrive queues msg and runs the hook where it arrives, as a connection's
// reader goroutine does, returning the Wakes it caused.
func (m *inlineMemServer) arrive(msg xfer.Message) int {
	m.push(msg)
	m.mu.Lock()
	f, before := m.hook, m.wakes
	m.mu.Unlock()
	f()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.wakes - before
}

// A request that arrives while Serve sleeps is answered on the goroutine
// it arrived on, before the hook returns, and Serve is woken only when the
// step made its sleep too long: a grant on a data plane it must poll
// (every 5 ms, not the idle second). While a step is under way the hook
// leaves the request to it.
func TestProducerServesWhereRequestsArrive(t *testing.T) {
	c, srv := inlineWorld()
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv, xfake.New("prod", 16, 8), c))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- p.Serve(ctx) }()
	<-srv.hookSet
	<-srv.parked
	req := func(mm string, n int) xfer.Message {
		return xfer.Message{Identity: []byte("c"), Payload: wire.AppendReq(nil, &wire.XferReq{MMHash: mm, CompatibilityHash: compat, SessionID: uuidN(n)})}
	}
	status := func(i int) wire.Status {
		var a wire.XferAck
		if err := wire.DecodeAck(srv.replyTo("c")[i], &a); err != nil {
			t.Fatal(err)
		}
		return a.Status
	}

	if w := srv.arrive(req("missing", 1)); w != 0 || len(srv.replyTo("c")) != 1 || status(0) != wire.NackMissing {
		t.Fatalf("NACK: %d replies, %d wakes", len(srv.replyTo("c")), w)
	}
	if w := srv.arrive(req("A", 2)); w != 1 || len(srv.replyTo("c")) != 2 || status(1) != wire.OK {
		t.Fatalf("grant: %d replies, %d wakes", len(srv.replyTo("c")), w)
	}
	<-srv.parked // Serve planned anew, for the grant

	p.mu.Lock() // a step under way
	w := srv.arrive(req("missing", 3))
	if n := len(srv.replyTo("c")); n != 2 || w != 0 {
		p.mu.Unlock()
		t.Fatalf("hook answered under a step: %d replies, %d wakes", n, w)
	}
	p.mu.Unlock()
	srv.Wake() // what transport.Server does for a request left queued
	<-srv.parked
	if n := len(srv.replyTo("c")); n != 3 {
		t.Fatalf("request left queued: %d replies", n)
	}
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve: %v", err)
	}
	srv.mu.Lock()
	if srv.hook != nil {
		t.Fatal("Serve left its hook set")
	}
	srv.mu.Unlock()
}

// notifyFake is a data plane that runs a function where notifications
// arrive, as transport.TCPData does for the session attached to it.
type notifyFake struct {
	*xfake.Fake
	mu    sync.Mutex
	hook  func() bool
	never chan struct{}
}

func (f *notifyFake) Attach(plane.Gate) plane.Attachment { return notifyAttachment{f} }

type notifyAttachment struct{ f *notifyFake }

func (notifyAttachment) Publish(uint64)                          {}
func (notifyAttachment) Retire(uint64)                           {}
func (notifyAttachment) Push(uint64, []byte, []int, func()) bool { return false }
func (notifyAttachment) Detach()                                 {}
func (a notifyAttachment) OnNotify(h func() bool)                { a.f.OnNotify(h) }
func (notifyAttachment) Broken(dst []xfer.Notif) []xfer.Notif    { return dst }

// Ready: it signals (never, here), so Serve sleeps until the lease rather
// than polling every 5 ms.
func (f *notifyFake) Ready() <-chan struct{} { return f.never }

func (f *notifyFake) OnNotify(h func() bool) {
	f.mu.Lock()
	f.hook = h
	f.mu.Unlock()
}

func (f *notifyFake) arrive(agent string, msg []byte) bool {
	f.InjectNotif(agent, msg)
	f.mu.Lock()
	h := f.hook
	f.mu.Unlock()
	return h != nil && h()
}

// A completion notification is taken where it arrives: the grant ends (its
// pin goes) before the data plane's hook returns, without waking Serve;
// under a step already under way the hook leaves it (false: the data
// plane signals instead); Serve unsets the hook when it returns.
func TestProducerTakesNotificationsWhereTheyArrive(t *testing.T) {
	c, srv := inlineWorld()
	data := &notifyFake{Fake: xfake.New("prod", 16, 8), never: make(chan struct{})}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv, data, c))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- p.Serve(ctx) }()
	<-srv.hookSet
	<-srv.parked
	grant := func(n int) uint64 {
		t.Helper()
		before := len(srv.replyTo("c"))
		if w := srv.arrive(xfer.Message{Identity: []byte("c"), Payload: wire.AppendReq(nil, &wire.XferReq{MMHash: "A", CompatibilityHash: compat, SessionID: uuidN(n)})}); w > 0 {
			<-srv.parked // Serve planned anew, for the grant
		}
		var a wire.XferAck
		if err := wire.DecodeAck(srv.replyTo("c")[before], &a); err != nil || a.Status != wire.OK {
			t.Fatalf("ack %+v, %v", a, err)
		}
		return a.Grant
	}
	g := grant(1)
	srv.mu.Lock()
	wakes := srv.wakes
	srv.mu.Unlock()
	if !data.arrive("cons", fmt.Appendf(nil, "%s:A#%d", uuidN(1), g)) || p.Grants() != 0 {
		t.Fatalf("notification not taken where it arrived: %d grants", p.Grants())
	}
	if e, _ := c.Get("A"); e.Pins != 0 {
		t.Fatal("still pinned after the hook returned")
	}
	srv.mu.Lock()
	woke := srv.wakes - wakes
	srv.mu.Unlock()
	switch woke {
	case 0:
		select {
		case <-srv.parked:
			t.Fatal("Serve woke for a notification taken inline")
		case <-time.After(20 * time.Millisecond):
		}
	case 1: // the grant's end made Serve's plan too late: it plans anew
		<-srv.parked
	default:
		t.Fatalf("%d wakes", woke)
	}
	g = grant(2)
	p.mu.Lock() // a step under way
	took := data.arrive("cons", fmt.Appendf(nil, "%s:A#%d", uuidN(2), g))
	p.mu.Unlock()
	if took || p.Grants() != 1 {
		t.Fatalf("hook took a notification under a step: %v, %d grants", took, p.Grants())
	}
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve: %v", err)
	}
	data.mu.Lock()
	defer data.mu.Unlock()
	if data.hook != nil {
		t.Fatal("Serve left its notification hook set")
	}
}

// Wait and WaitFor, for an engine that steps the producer itself: WaitFor
// returns at the latest after its bound, at once while requests wait for
// a step, and false once ctx ended or the producer is closed.
func TestProducerWait(t *testing.T) {
	c := cache.NewEmbeddingCache(16)
	c.Alloc("A", 1)
	c.MarkReady("A")
	srv := &memServer{replies: map[string][][]byte{}}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, MaxRequestsPerStep: 1}, srv, xfake.New("prod", 16, 8), c))
	ctx := context.Background()
	start := time.Now()
	if !p.WaitFor(ctx, 5*time.Millisecond) || time.Since(start) < 5*time.Millisecond {
		t.Fatalf("WaitFor(5ms) after %v", time.Since(start))
	}
	for i := range 2 {
		srv.push(xfer.Message{Identity: []byte("c"), Payload: wire.AppendReq(nil, &wire.XferReq{MMHash: "A", CompatibilityHash: compat, SessionID: uuidN(i)})})
	}
	p.Step(t0) // answers one; the other waits for the next step
	start = time.Now()
	if !p.WaitFor(ctx, 10*time.Second) || time.Since(start) > time.Second {
		t.Fatalf("WaitFor with a request waiting: %v", time.Since(start))
	}
	p.Step(t0)
	if len(srv.replyTo("c")) != 2 {
		t.Fatalf("%d replies", len(srv.replyTo("c")))
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if p.Wait(ended) {
		t.Fatal("Wait past its context returned true")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.Wait(ctx) {
		t.Fatal("Wait on a closed producer returned true")
	}
}

// holdCount is a plane that counts who holds it waiting (plane.Waiter),
// now and in all.
type holdCount struct {
	mu       sync.Mutex
	n, total int
}

func (h *holdCount) Waiting() (done func()) {
	h.mu.Lock()
	h.n++
	h.total++
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		h.n--
		h.mu.Unlock()
	}
}

func (h *holdCount) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func (h *holdCount) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total
}

// waitingServer is a control server that is a plane.Waiter and counts
// the Drains made while it and the data plane were both held waiting.
type waitingServer struct {
	*memServer
	holdCount
	data          *holdCount
	drains, holds atomic.Int64
}

func (w *waitingServer) Drain(dst []xfer.Message) []xfer.Message {
	w.drains.Add(1)
	if w.count() > 0 && w.data.count() > 0 {
		w.holds.Add(1)
	}
	return w.memServer.Drain(dst)
}

type waitingData struct {
	*xfake.Fake
	*holdCount
}

// Serve holds both planes waiting for its whole run, its own steps
// included: its steps run where messages arrive, and a plane that reads
// its sockets in the steps of a loop that never waits must not, for Serve.
func TestServeHoldsItsPlanesWaiting(t *testing.T) {
	data := waitingData{xfake.New("prod", 16, 8), &holdCount{}}
	srv := &waitingServer{memServer: &memServer{replies: map[string][][]byte{}}, data: data.holdCount}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv, data, cache.NewEmbeddingCache(16)))
	defer p.Close()
	serveUntilStepped(t, p, srv)
	if d, h := srv.drains.Load(), srv.holds.Load(); d == 0 || h != d {
		t.Fatalf("%d of Serve's %d steps ran with both planes held waiting", h, d)
	}
	if srv.count() != 0 || data.count() != 0 {
		t.Fatalf("held after Serve returned: control %d, data %d", srv.count(), data.count())
	}
}

// serveUntilStepped runs p's Serve until it made a step (an idle Serve
// steps once a second), however late a loaded machine lets it: a Serve
// ended by a timer could end before its first step.
func serveUntilStepped(t *testing.T, p *Producer, srv *waitingServer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { p.Serve(ctx); close(served) }()
	defer func() { cancel(); <-served }()
	for end := time.Now().Add(30 * time.Second); srv.drains.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("Serve made no step in 30 s")
		}
	}
}

// servingData is a data plane that can be held for a Serve alone
// (plane.Serving), besides a loop's wait (plane.Waiter).
type servingData struct {
	waitingData
	serve *holdCount
}

func (d servingData) Serving() (done func())      { return d.serve.Waiting() }
func (d servingData) ServeReady() <-chan struct{} { return nil }

// servingProducer is a Producer over a servingData plane, whose control
// server counts the steps made with the plane held for Serve.
func servingProducer(t *testing.T) (*Producer, servingData, *waitingServer) {
	data := servingData{waitingData{xfake.New("prod", 16, 8), &holdCount{}}, &holdCount{}}
	srv := &waitingServer{memServer: &memServer{replies: map[string][][]byte{}}, data: data.serve}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv, data, cache.NewEmbeddingCache(16)))
	t.Cleanup(func() { p.Close() })
	return p, data, srv
}

// A data plane that tells Serve's hold apart is held that way for Serve's
// whole run, and never as a loop's wait: Serve's goroutine steps no
// consumer, and a Pool stepping on the same plane keeps its sockets.
func TestServeHoldsItsDataPlaneServing(t *testing.T) {
	p, data, srv := servingProducer(t)
	serveUntilStepped(t, p, srv)
	if d, h := srv.drains.Load(), srv.holds.Load(); d == 0 || h != d {
		t.Fatalf("%d of Serve's %d steps ran with the data plane held for Serve", h, d)
	}
	if waits := data.holdCount.held(); waits != 0 {
		t.Fatalf("Serve held the data plane as a loop's wait %d times", waits)
	}
	if data.serve.count() != 0 {
		t.Fatal("held after Serve returned")
	}
	// A loop's wait, outside Serve, is a Waiting.
	p.WaitFor(context.Background(), time.Millisecond)
	if waits := data.holdCount.held(); waits != 1 || data.holdCount.count() != 0 {
		t.Fatalf("WaitFor held the plane %d times, %d still", waits, data.holdCount.count())
	}
}

// An engine loop that steps the Producer and waits in its WaitFor while
// Serve runs on another goroutine holds the data plane as a loop's wait
// (it may step a Pool on the same plane), whatever Serve holds.
func TestLoopWaitWhileServeRuns(t *testing.T) {
	p, data, _ := servingProducer(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { p.Serve(ctx); close(served) }()
	defer func() { cancel(); <-served }()
	for data.serve.count() == 0 { // Serve holds the plane first thing
		runtime.Gosched()
	}
	for i := range 3 {
		p.Step(time.Now())
		p.WaitFor(context.Background(), time.Millisecond)
		if waits := data.holdCount.held(); waits != i+1 {
			t.Fatalf("after %d waits of the loop, %d held the plane as a loop's wait", i+1, waits)
		}
	}
}

// The backlog's rule: past MaxBacklog requests or backlogBytes, the
// requests dropped are the newest of the consumers holding the most, so a
// consumer whose requests, waiting and new, stay within an equal share of
// both (the budget over the number of consumers) loses none, whoever
// floods beside it and however large its requests.
func TestBacklogDropsTheFloodersOwn(t *testing.T) {
	const maxBacklog, steps = 4000, 30
	srv := &memServer{replies: map[string][][]byte{}}
	p := must(NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, MaxPerPeerPerStep: 1, MaxBacklog: maxBacklog},
		srv, xfake.New("prod", 16, 8), cache.NewEmbeddingCache(16)))
	junk := make([]byte, 60<<10)
	honest := []string{"h1", "h2", "h3"}
	sent := map[string]int{}
	check := func(step int) {
		t.Helper()
		var size int64
		waiting := p.waiting.list()
		for _, m := range waiting {
			size += cost(m)
		}
		if len(waiting) > maxBacklog || size > backlogBytes || size != p.waiting.bytes || len(waiting) != p.waiting.n {
			t.Fatalf("step %d: %d requests (%d bytes; counted %d, %d) wait, over %d (%d)",
				step, len(waiting), size, p.waiting.n, p.waiting.bytes, maxBacklog, backlogBytes)
		}
	}
	for step := range steps {
		// The flood first, in each step's arrivals: large, many.
		for i := range 3000 {
			srv.push(xfer.Message{Identity: []byte("flood"), Payload: junk[:(i*7919)%len(junk)+1]})
		}
		for k, id := range honest {
			for range 1 + (step+k)%2 { // 1.5 a step on average, 1 answered a step
				sent[id]++
				srv.push(xfer.Message{Identity: []byte(id), Payload: wire.AppendReq(nil,
					&wire.XferReq{MMHash: fmt.Sprint(id, sent[id]), CompatibilityHash: compat, SessionID: uuidN(sent[id])})})
			}
		}
		p.Step(t0)
		check(step)
	}
	for step := 0; ; step++ {
		if waiting, _ := p.Backlog(); waiting == 0 {
			break
		}
		p.Step(t0)
		check(steps + step)
	}
	for _, id := range honest {
		if got := len(srv.replyTo(id)); got != sent[id] {
			t.Errorf("%s: %d answers to %d requests", id, got, sent[id])
		}
	}
	if _, dropped := p.Backlog(); dropped == 0 {
		t.Error("nothing dropped: the flood never reached the bounds")
	}
}

// The backlog's trim rule over random backlogs: both bounds hold; each consumer
// keeps a prefix of its requests (the newest drop) in arrival order; a
// consumer within an equal share of both bounds keeps all; the count of
// drops is exact; and where bytes do not bind, no more is dropped than the
// count bound needs, however many consumers share it.
func TestTrimBacklogRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	junk := make([]byte, 1<<20)
	for trial := range 300 {
		maxBacklog := 1 + rng.IntN(300)
		var b backlog
		ids := 1 + rng.IntN(400)
		big := rng.IntN(3) == 0 // requests large enough for the byte bound to bind
		n := rng.IntN(3 * maxBacklog)
		type want struct{ n, bytes int64 }
		per := map[string]*want{}
		for i := range n {
			id := fmt.Sprint("c", rng.IntN(ids)%(1+rng.IntN(ids)))
			size := 1 + rng.IntN(200)
			if big {
				size = 1 + rng.IntN(len(junk))
			}
			m := xfer.Message{Identity: []byte(id), Payload: junk[:size], At: time.Unix(int64(i), 0)}
			b.add(m)
			if per[id] == nil {
				per[id] = &want{}
			}
			per[id].n++
			per[id].bytes += cost(m)
		}
		before := b.list()
		b.trim(maxBacklog, backlogBytes)
		after := b.list()
		var size int64
		next := map[string]int{} // each consumer's requests, in order, as kept
		kept := 0
		for i, m := range after {
			size += cost(m)
			if i > 0 && !after[i-1].At.Before(m.At) {
				t.Fatalf("trial %d: out of arrival order at %d", trial, i)
			}
			next[string(m.Identity)]++
			kept++
		}
		if len(after) > maxBacklog || size > backlogBytes || b.n != len(after) || b.bytes != size {
			t.Fatalf("trial %d: %d requests, %d bytes kept (counted %d, %d)", trial, len(after), size, b.n, b.bytes)
		}
		if int(b.dropped) != len(before)-kept {
			t.Fatalf("trial %d: %d counted dropped, %d dropped", trial, b.dropped, len(before)-kept)
		}
		// A prefix: the k requests kept of a consumer are its k oldest.
		seen := map[string]int{}
		j := 0
		for _, m := range before {
			id := string(m.Identity)
			if seen[id] < next[id] {
				if j >= len(after) || after[j].At != m.At {
					t.Fatalf("trial %d: %s kept a newer request over an older one", trial, id)
				}
				j++
			}
			seen[id]++
		}
		k := int64(len(per))
		var total int64
		for id, w := range per {
			total += w.bytes
			if w.n <= int64(maxBacklog)/k && w.bytes <= backlogBytes/k && next[id] != int(w.n) {
				t.Fatalf("trial %d: %s within an equal share lost %d of %d", trial, id, w.n-int64(next[id]), w.n)
			}
		}
		if total <= backlogBytes && kept != min(len(before), maxBacklog) {
			t.Fatalf("trial %d: bytes never bound, yet %d of %d kept with room for %d", trial, kept, len(before), maxBacklog)
		}
	}
}
