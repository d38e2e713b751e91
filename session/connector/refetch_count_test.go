package connector_test

import (
	"context"

	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// plainClient is a control plane that makes a Pool speak as vLLM's
// consumer does: its requests carry none of this library's extensions
// (no attempt, agent, version on the wire or shape offer), and it reads
// none in the acks (no grant, token, lease or echoed attempt).
type plainClient struct{ *transport.Client }

func (c plainClient) Send(addr string, p []byte) error {
	var r wire.XferReq
	if err := wire.DecodeReq(p, &r); err != nil {
		return err
	}
	return c.Client.Send(addr, wire.AppendReq(nil, &wire.XferReq{MMHash: r.MMHash, CompatibilityHash: r.CompatibilityHash, SessionID: r.SessionID}))
}

func (c plainClient) Drain(dst []xfer.Inbound) []xfer.Inbound {
	n := len(dst)
	dst = c.Client.Drain(dst)
	for i := n; i < len(dst); i++ {
		var a wire.XferAck
		if wire.DecodeAck(dst[i].Payload, &a) == nil {
			a.Grant, a.Token, a.LeaseMillis, a.Attempt, a.Shape = 0, wire.Token{}, 0, 0, wire.Blocks{}
			dst[i].Payload = wire.AppendAck(nil, &a)
		}
	}
	return dst
}

// A consumer re-fetches the entries of a producer that holds 128, every one
// ready, with room for one more save, 64 fetches in flight, over real
// sockets and the TCP data plane: a consumer that speaks as vLLM's gets
// no NACK_NOT_READY (the pinned share bites only when a pin would leave a
// save no room), and a Go consumer sends at most 1 % more requests than it
// fetches.
func TestRefetchCountsRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("20,200 fetches over real sockets, twice")
	}
	const (
		entries  = 128
		inFlight = 64
		fetches  = 20200
		bs       = 4096
	)
	for _, kind := range []string{"vllm-shaped", "go"} {
		t.Run(kind, func(t *testing.T) {
			pr := must(cache.NewRegion(cache.RegionConfig{Blocks: 2*entries + 2, BlockSize: bs, NoLock: true}))
			defer pr.Close()
			pc := cache.NewEmbeddingCache(pr.Blocks())
			for i := range entries {
				e := must(pc.Alloc(benchHash(i), 2))
				for j, b := range e.Blocks {
					benchFill(pr.Block(b), i, j)
				}
				pc.MarkReady(benchHash(i))
			}
			pdata := must(transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: benchQuiet, NoSharedMemory: true}, pr))
			defer pdata.Close()
			srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
			defer srv.Close()
			prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet}, srv, pdata, pc))
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan struct{})
			go func() { prod.Serve(ctx); close(served) }()
			defer func() { cancel(); <-served; prod.Close() }()

			cr := must(cache.NewRegion(cache.RegionConfig{Blocks: 2 * inFlight, BlockSize: bs, NoLock: true}))
			defer cr.Close()
			cdata := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, cr))
			defer cdata.Close()
			cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
			defer cli.Close()
			var ctl connector.ControlClient = cli
			if kind == "vllm-shaped" {
				ctl = plainClient{cli}
			}
			pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: bs, Logger: benchQuiet}, ctl, cdata))
			defer pool.Close()

			free := make([]int, cr.Blocks())
			for i := range free {
				free[i] = i
			}
			started, ended, next := 0, 0, 0
			busy := map[string]bool{}
			deadline := time.Now().Add(40 * time.Second)
			for ended < fetches {
				if time.Now().After(deadline) {
					t.Fatalf("stuck: %d of %d ended, %d started, %d in flight, %d free, %d busy", ended, fetches, started, pool.InFlight(), len(free), len(busy))
				}
				for started < fetches && len(free) >= 2 && !busy[benchHash(next%entries)] {
					h := benchHash(next % entries)
					next++
					now := time.Now()
					blocks := []int{free[len(free)-1], free[len(free)-2]}
					if _, err := pool.Fetch(srv.Endpoint(), h, blocks, now.Add(20*time.Second), now); err != nil {
						t.Fatal(err)
					}
					free = free[:len(free)-2]
					busy[h] = true
					started++
				}
				r := pool.Step(time.Now())
				for _, d := range r.Completed {
					free = append(free, d.Blocks...)
					delete(busy, d.MMHash)
					ended++
				}
				for _, f := range r.Failed {
					t.Fatalf("%s failed: %s %s", f.MMHash, f.Reason, f.Status)
				}
				if ended < fetches {
					pool.WaitFor(ctx, 10*time.Millisecond)
				}
			}
			ps, st := pool.Stats(), prod.Stats()
			extra := int(st.Requests) - fetches
			t.Logf("%s: %d fetches, %d requests (%d extra), NACK_NOT_READY %d, retries %d, ack timeouts %d; producer refused %d over its share, %d over the grants per entry",
				kind, fetches, st.Requests, extra, ps.Nacks[wire.NackNotReady], ps.Retries, ps.AckTimeouts, st.OverPinned, st.OverBound)
			if kind == "vllm-shaped" && ps.Nacks[wire.NackNotReady] != 0 {
				t.Fatalf("%d NACK_NOT_READY for entries that were ready", ps.Nacks[wire.NackNotReady])
			}
			if kind == "go" && extra > fetches/100 {
				t.Fatalf("%d extra requests for %d fetches", extra, fetches)
			}

		})
	}
}
