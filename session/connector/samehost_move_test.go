package connector_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// A consumer whose control plane moves to the producer's same-host socket
// between fetches keeps fetching over either data plane: its session
// goes on under the new connection (pushes included, over TCP), and every
// fetch brings the entry's bytes.
func TestFetchAcrossTheSameHostMove(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shm", false: "tcp"}[shared], func(t *testing.T) {
			const bs, blocks = 4096, 3
			pr, err := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: bs, Shared: shared})
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			entries := cache.NewEmbeddingCache(pr.Blocks())
			fill := func(i, j int) []byte { return bytes.Repeat([]byte{byte(16*i + j + 1)}, bs) }
			for i, h := range []string{"a", "b"} {
				e, err := entries.Alloc(h, blocks)
				if err != nil {
					t.Fatal(err)
				}
				for j, b := range e.Blocks {
					copy(pr.Block(b), fill(i, j))
				}
				entries.MarkReady(h)
			}
			pdata, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger, NoSharedMemory: !shared}, pr)
			if err != nil {
				t.Fatal(err)
			}
			defer pdata.Close()
			srv, err := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			prod, err := connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, srv, pdata, entries)
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan struct{})
			go func() { defer close(served); prod.Serve(ctx) }()
			defer func() { cancel(); <-served }()

			cr, err := cache.NewRegion(cache.RegionConfig{Blocks: 3 * blocks, BlockSize: bs})
			if err != nil {
				t.Fatal(err)
			}
			defer cr.Close()
			cdata, err := transport.NewTCPData(transport.TCPConfig{Logger: logger, NoSharedMemory: !shared}, cr)
			if err != nil {
				t.Fatal(err)
			}
			defer cdata.Close()
			ctl := transport.NewClient(transport.ClientConfig{Logger: logger})
			defer ctl.Close()
			pool, err := connector.NewPool(connector.PoolConfig{CompatHash: compat, BlockSize: bs, Logger: logger}, ctl, cdata)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			for i := range 30 {
				k := i % 2
				into := []int{(i % 3) * blocks, (i%3)*blocks + 1, (i%3)*blocks + 2}
				now := time.Now()
				if _, err := pool.Fetch(srv.Endpoint(), []string{"a", "b"}[k], into, now.Add(10*time.Second), now); err != nil {
					t.Fatal(err)
				}
				for done := false; !done; {
					wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
					ok := pool.Wait(wctx)
					wcancel()
					if !ok {
						t.Fatalf("fetch %d: nothing after 10 s", i)
					}
					r := pool.Step(time.Now())
					if len(r.Failed) > 0 {
						t.Fatalf("fetch %d: %v", i, r.Failed[0].Err)
					}
					done = len(r.Completed) > 0
				}
				for j, b := range into {
					if !bytes.Equal(cr.Block(b), fill(k, j)) {
						t.Fatalf("fetch %d: block %d differs", i, j)
					}
				}
				if i == 0 {
					deadline := time.Now().Add(10 * time.Second)
					for ctl.Stats().SameHost == 0 && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
					}
				}
			}
			if st := ctl.Stats(); st.SameHost != 1 || srv.Stats().SameHost != 1 {
				t.Fatalf("client %+v, server %+v", st, srv.Stats())
			}
			// Pushes are per control-plane identity: the first fetch (its
			// data link not yet known) and the first on the new
			// connection go without.
			if !shared {
				if st := prod.Stats(); st.Pushes < 28 {
					t.Fatalf("%d of 30 fetches pushed", st.Pushes)
				}
			}
		})
	}
}
