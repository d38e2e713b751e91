package connector

import (
	"context"
	"fmt"
	"testing"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// sinkServer is a control server whose replies go nowhere.
type sinkServer struct{ in []xfer.Message }

func (s *sinkServer) Drain(dst []xfer.Message) []xfer.Message {
	dst = append(dst, s.in...)
	clear(s.in)
	s.in = s.in[:0]
	return dst
}
func (s *sinkServer) Reply(_, _ []byte) error       { return nil }
func (s *sinkServer) Wait(ctx context.Context) bool { <-ctx.Done(); return false }

// floodSteps has one consumer bring n requests, then, b.N times, perStep
// more before each Step (ns/request). Each is a NACK_MISSING (an entry
// the cache does not hold).
func floodSteps(b *testing.B, cfg ProducerConfig, n, perStep int) *Producer {
	srv := &sinkServer{}
	cfg.CompatHash, cfg.Logger = compat, quiet
	p := must(NewProducer(cfg, srv, xfake.New("prod", 16, 8), cache.NewEmbeddingCache(16)))
	req := wire.AppendReq(nil, &wire.XferReq{MMHash: "absent", CompatibilityHash: compat,
		SessionID: uuidN(1), VersionOnWire: true, Attempt: 1})
	msg := xfer.Message{Identity: []byte("flood"), Payload: req}
	for range n {
		srv.in = append(srv.in, msg)
	}
	p.Step(t0)
	for b.Loop() {
		for range perStep {
			srv.in = append(srv.in, msg)
		}
		p.Step(t0)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perStep), "ns/request")
	return p
}

// BenchmarkBacklogOverBound is BenchmarkBacklogStep with the flood past
// MaxBacklog: each Step drops as many of its requests as it answers
// (ns/request, answered or dropped), touching none of those kept.
func BenchmarkBacklogOverBound(b *testing.B) {
	for _, max := range []int{1024, 16384} {
		b.Run(fmt.Sprint("maxBacklog=", max), func(b *testing.B) {
			p := floodSteps(b, ProducerConfig{MaxBacklog: max}, max, 2*64)
			if _, dropped := p.Backlog(); dropped == 0 {
				b.Fatal("nothing dropped")
			}
		})
	}
}

// BenchmarkBacklogStep is the cost of a request from one consumer while
// backlog of its requests wait (ns/request): the flood keeps the backlog
// at its size, each Step taking MaxPerPeerPerStep (64) of them and walking
// none of the rest.
func BenchmarkBacklogStep(b *testing.B) {
	for _, n := range []int{256, 4096, 16000} {
		b.Run(fmt.Sprint("backlog=", n), func(b *testing.B) {
			p := floodSteps(b, ProducerConfig{}, n, 64)
			if w, _ := p.Backlog(); w < n-64 || w > n {
				b.Fatalf("backlog %d, want about %d", w, n)
			}
		})
	}
}
