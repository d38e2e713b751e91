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

// ctlWorld is a Producer serving entries "a" and "b" (three 4 KiB blocks
// each) on a control plane bound to ctlAddr, and a Pool to fetch them.
type ctlWorld struct {
	srv  *transport.Server
	prod *connector.Producer
	ctl  *transport.Client
	pool *connector.Pool
	cr   *cache.Region
}

const ctlBS, ctlBlocks = 4096, 3

// ctlFill is block j of entry i.
func ctlFill(i, j int) []byte { return bytes.Repeat([]byte{byte(16*i + j + 1)}, ctlBS) }

func newCtlWorld(t *testing.T, shared bool, ctlAddr string) *ctlWorld {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	pr, err := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: ctlBS, Shared: shared})
	must(err)
	t.Cleanup(func() { pr.Close() })
	entries := cache.NewEmbeddingCache(pr.Blocks())
	for i, h := range []string{"a", "b"} {
		e, err := entries.Alloc(h, ctlBlocks)
		must(err)
		for j, b := range e.Blocks {
			copy(pr.Block(b), ctlFill(i, j))
		}
		entries.MarkReady(h)
	}
	pdata, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger, NoSharedMemory: !shared}, pr)
	must(err)
	t.Cleanup(func() { pdata.Close() })
	w := &ctlWorld{}
	w.srv, err = transport.Listen(ctlAddr, transport.ServerConfig{Logger: logger})
	must(err)
	t.Cleanup(func() { w.srv.Close() })
	w.prod, err = connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, w.srv, pdata, entries)
	must(err)
	t.Cleanup(func() { w.prod.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); w.prod.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })

	w.cr, err = cache.NewRegion(cache.RegionConfig{Blocks: 3 * ctlBlocks, BlockSize: ctlBS})
	must(err)
	t.Cleanup(func() { w.cr.Close() })
	cdata, err := transport.NewTCPData(transport.TCPConfig{Logger: logger, NoSharedMemory: !shared}, w.cr)
	must(err)
	t.Cleanup(func() { cdata.Close() })
	w.ctl = transport.NewClient(transport.ClientConfig{Logger: logger})
	t.Cleanup(func() { w.ctl.Close() })
	w.pool, err = connector.NewPool(connector.PoolConfig{CompatHash: compat, BlockSize: ctlBS, Logger: logger}, w.ctl, cdata)
	must(err)
	t.Cleanup(func() { w.pool.Close() })
	return w
}

// fetch fetches entry k ("a" or "b") as fetch i and checks its bytes.
func (w *ctlWorld) fetch(t *testing.T, i, k int) {
	t.Helper()
	into := []int{(i % 3) * ctlBlocks, (i%3)*ctlBlocks + 1, (i%3)*ctlBlocks + 2}
	now := time.Now()
	if _, err := w.pool.Fetch(w.srv.Endpoint(), []string{"a", "b"}[k], into, now.Add(10*time.Second), now); err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok := w.pool.Wait(wctx)
		wcancel()
		if !ok {
			t.Fatalf("fetch %d: nothing after 10 s", i)
		}
		r := w.pool.Step(time.Now())
		if len(r.Failed) > 0 {
			t.Fatalf("fetch %d: %v", i, r.Failed[0].Err)
		}
		done = len(r.Completed) > 0
	}
	for j, b := range into {
		if !bytes.Equal(w.cr.Block(b), ctlFill(k, j)) {
			t.Fatalf("fetch %d: block %d differs", i, j)
		}
	}
}

var planes = map[bool]string{true: "shm", false: "tcp"}

// A consumer whose control plane moves to the producer's same-host socket
// between fetches keeps fetching over either data plane: its session
// goes on under the new connection (pushes included, over TCP), and every
// fetch brings the entry's bytes.
func TestFetchAcrossTheSameHostMove(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(planes[shared], func(t *testing.T) {
			w := newCtlWorld(t, shared, "tcp://127.0.0.1:0")
			var before uint64 // pushes before the move
			for i := range 30 {
				w.fetch(t, i, i%2)
				if i == 0 {
					deadline := time.Now().Add(10 * time.Second)
					for w.ctl.Stats().SameHost == 0 && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
					}
					before = w.prod.Stats().Pushes
				}
			}
			if st := w.ctl.Stats(); st.SameHost != 1 || w.srv.Stats().SameHost != 1 {
				t.Fatalf("client %+v, server %+v", st, w.srv.Stats())
			}
			// Pushes are per control-plane identity: the first fetch on
			// the new connection (its data link not yet known) goes
			// without, and a grant is not pushed while its consumer has
			// others live, which a loaded machine's slow notifications
			// make happen. Pushes going on under the new connection is
			// what is shown: most of the 29 fetches after the move.
			if !shared {
				if after := w.prod.Stats().Pushes - before; after < 15 {
					t.Fatalf("%d of the 29 fetches after the move pushed", after)
				}
			}
		})
	}
}

// A producer whose control plane is a Unix-domain socket serves fetches
// as one on TCP does, over either data plane, and the bytes are the
// entry's.
func TestFetchOverIPCControl(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(planes[shared], func(t *testing.T) {
			w := newCtlWorld(t, shared, "ipc://"+filepath.Join(t.TempDir(), "ctl.sock"))
			for i, k := range []int{0, 1, 0} {
				w.fetch(t, i, k)
			}
		})
	}
}
