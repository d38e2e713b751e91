package connector

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

// memServer is an in-memory control server.
type memServer struct {
	in      []session.Message
	replies map[string][][]byte
}

func (m *memServer) Drain(dst []session.Message) []session.Message {
	dst = append(dst, m.in...)
	m.in = nil
	return dst
}
func (m *memServer) Reply(id, p []byte) error {
	m.replies[string(id)] = append(m.replies[string(id)], bytes.Clone(p))
	return nil
}
func (m *memServer) Wait(ctx context.Context) bool { <-ctx.Done(); return false }

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
	p := NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, MaxRequestsPerStep: 100, MaxPerPeerPerStep: 10, MaxGrants: 50, MaxPinnedShare: 1},
		srv, xfertest.New("prod", 16, 8), c)
	for i := range 1000 {
		srv.in = append(srv.in, session.Message{Identity: []byte("flood"),
			Payload: wire.AppendReq(nil, &wire.XferReq{MMHash: "A", CompatibilityHash: compat, SessionID: uuidN(i)})})
	}
	srv.in = append(srv.in, session.Message{Identity: []byte("honest"),
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
	if len(srv.replies["flood"]) != 1000 || e.Pins != 49 || p.Session().Stats().OverBound != 951 {
		t.Fatalf("replies %d, pins %d, refused %d", len(srv.replies["flood"]), e.Pins, p.Session().Stats().OverBound)
	}
	if waiting, _ := p.Backlog(); waiting != 0 {
		t.Fatalf("%d left waiting", waiting)
	}
}

func TestProducerBacklogBound(t *testing.T) {
	srv := &memServer{replies: map[string][][]byte{}}
	p := NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet, MaxPerPeerPerStep: 1, MaxBacklog: 10},
		srv, xfertest.New("prod", 16, 8), cache.NewEmbeddingCache(16))
	for range 30 {
		srv.in = append(srv.in, session.Message{Identity: []byte("x"), Payload: []byte{0x80}})
	}
	p.Step(t0)
	if waiting, dropped := p.Backlog(); waiting != 9 || dropped != 20 {
		t.Fatalf("waiting %d dropped %d", waiting, dropped)
	}
}

func TestProducerServeStops(t *testing.T) {
	srv := &memServer{replies: map[string][][]byte{}}
	p := NewProducer(ProducerConfig{CompatHash: compat, Logger: quiet}, srv, xfertest.New("prod", 16, 8), cache.NewEmbeddingCache(16))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := p.Serve(ctx, nil); err == nil {
		t.Fatal("Serve returned nil")
	}
	if p.Close() != 0 {
		t.Fatal("grants left")
	}
}
