package transport

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
)

// The sessions reach the planes' plumbing through internal/plane: a
// TCPData offers its contact, its gate, its signal, its name and a Release
// that stops READs; a Server and a Client their hooks for the connector.
func TestPlaneAdapters(t *testing.T) {
	d := newTCP(t, newRegion(t, 8, 64), TCPConfig{Name: "agent-a"})
	if plane.ContacterOf(d) == nil || plane.AttacherOf(d) == nil {
		t.Fatal("no contacter or attacher")
	}
	if n, ok := plane.As[plane.Named](d); !ok || n.Name() != "agent-a" {
		t.Fatalf("named: %v", ok)
	}
	if s, ok := plane.As[plane.Stoppable](d); !ok || !s.StopsReads() {
		t.Fatalf("stoppable: %v", ok)
	}
	sg, ok := plane.As[plane.Signaling](d)
	if !ok || sg.Ready() == nil {
		t.Fatalf("signaling: %v", ok)
	}
	d.signal()
	select {
	case <-sg.Ready():
	case <-time.After(time.Second):
		t.Fatal("no signal")
	}
	if _, ok := plane.As[plane.ShapedPeers](d); ok {
		t.Fatal("the TCP plane does not register shapes")
	}

	type waiterOr interface {
		WaitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool
	}
	type inlineServer interface {
		OnRequest(func())
		Wake()
	}
	s := newServer(t, ServerConfig{})
	if _, ok := plane.As[waiterOr](s); !ok {
		t.Fatal("server: no WaitOr")
	}
	in, ok := plane.As[inlineServer](s)
	if !ok {
		t.Fatal("server: no OnRequest and Wake")
	}
	in.Wake()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if !s.Wait(ctx) {
		t.Fatal("Wake did not wake Wait")
	}
	c := newClient(t, ClientConfig{})
	w, ok := plane.As[waiterOr](c)
	if !ok {
		t.Fatal("client: no WaitOr")
	}
	ready := make(chan struct{}, 1)
	ready <- struct{}{}
	if !w.WaitOr(ctx, ready, nil) {
		t.Fatal("client WaitOr ignored ready")
	}
	if _, ok := plane.As[plane.Named](s); ok {
		t.Fatal("a control plane is not a data plane")
	}
}
