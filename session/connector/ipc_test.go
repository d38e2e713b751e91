package connector_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// A producer whose control plane is a Unix-domain socket serves fetches
// as one on TCP does, over either data plane, and the bytes are the
// entry's.
func TestFetchOverIPCControl(t *testing.T) {
	for _, shared := range []bool{true, false} {
		name := map[bool]string{true: "shm", false: "tcp"}[shared]
		t.Run(name, func(t *testing.T) {
			const bs, blocks = 4096, 3
			pr, err := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: bs, Shared: shared})
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			entries := cache.NewEmbeddingCache(pr.Blocks())
			for i, h := range []string{"a", "b"} {
				e, err := entries.Alloc(h, blocks)
				if err != nil {
					t.Fatal(err)
				}
				for j, b := range e.Blocks {
					copy(pr.Block(b), bytes.Repeat([]byte{byte(16*i + j + 1)}, bs))
				}
				entries.MarkReady(h)
			}
			pdata, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger, NoSharedMemory: !shared}, pr)
			if err != nil {
				t.Fatal(err)
			}
			defer pdata.Close()
			srv, err := transport.Listen("ipc://"+filepath.Join(t.TempDir(), "ctl.sock"), transport.ServerConfig{Logger: logger})
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
			defer cancel()
			served := make(chan struct{})
			go func() { defer close(served); prod.Serve(ctx) }()
			defer func() { cancel(); <-served }()

			cr, err := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: bs})
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
			for i, h := range []string{"a", "b", "a"} {
				into := []int{3 * i, 3*i + 1, 3*i + 2}
				now := time.Now()
				if _, err := pool.Fetch(srv.Endpoint(), h, into, now.Add(10*time.Second), now); err != nil {
					t.Fatal(err)
				}
				done := false
				for !done {
					wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
					if !pool.Wait(wctx) {
						wcancel()
						t.Fatalf("fetch %d of %s: nothing after 10 s", i, h)
					}
					wcancel()
					r := pool.Step(time.Now())
					if len(r.Failed) > 0 {
						t.Fatalf("fetch %d of %s: %v", i, h, r.Failed[0].Err)
					}
					done = len(r.Completed) > 0
				}
				k := map[string]int{"a": 0, "b": 1}[h]
				for j, b := range into {
					if !bytes.Equal(cr.Block(b), bytes.Repeat([]byte{byte(16*k + j + 1)}, bs)) {
						t.Fatalf("fetch %d of %s: block %d differs", i, h, j)
					}
				}
			}
		})
	}
}
