package connector_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// The re-fetch workload: a consumer re-fetches a few entries over and over at high
// concurrency, over real sockets and the TCP data plane, half of them again
// the moment they complete, so that many re-requests in the same session
// arrive while the previous grant's notification is still on its way (a
// few per cent do, on an idle machine or a loaded one). That notification
// must end the old grant, not the new one, or the new READ is refused
// (read-error) or runs unpinned. Every
// fetch completes with the producer's bytes, and the producer's grants end
// exactly once each, by completion or lease.
func TestRefetchSameEntriesUnderLoad(t *testing.T) {
	const (
		entries  = 128
		inFlight = 64
		fetches  = 6000
		bs       = 4096
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, _ := cache.NewRegion(cache.RegionConfig{Blocks: 2 * entries, BlockSize: bs})
	defer pr.Close()
	pc := cache.NewEmbeddingCache(pr.Blocks())
	want := map[string][]byte{}
	for i := range entries {
		h := fmt.Sprint("img-", i)
		e, _ := pc.Alloc(h, 2)
		for j, b := range e.Blocks {
			copy(pr.Block(b), bytes.Repeat([]byte{byte(i*2 + j + 1)}, bs))
		}
		want[h] = append(bytes.Clone(pr.Block(e.Blocks[0])), pr.Block(e.Blocks[1])...)
		pc.MarkReady(h)
	}
	pdata, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: logger}, pr)
	if err != nil {
		t.Fatal(err)
	}
	defer pdata.Close()
	srv, err := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: compat, Logger: logger}, srv, pdata, pc))
	served := make(chan struct{})
	go func() { prod.Serve(ctx); close(served) }()

	cr, _ := cache.NewRegion(cache.RegionConfig{Blocks: 2 * inFlight, BlockSize: bs})
	defer cr.Close()
	cdata, _ := transport.NewTCPData(transport.TCPConfig{Logger: logger}, cr)
	defer cdata.Close()
	cli := transport.NewClient(transport.ClientConfig{Logger: logger})
	defer cli.Close()
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: compat, BlockSize: bs, Logger: logger, Seed: 1}, cli, cdata))

	free := make([]int, cr.Blocks())
	for i := range free {
		free[i] = i
	}
	busy := map[string]bool{}
	var recent []string
	rng := rand.New(rand.NewPCG(1, 2))
	started, completed := 0, 0
	var failed []connector.Failure
	deadline := time.Now().Add(60 * time.Second)
	for completed+len(failed) < fetches {
		if time.Now().After(deadline) {
			t.Fatalf("stuck: %d completed, %d failed, %d in flight", completed, len(failed), pool.InFlight())
		}
		for started < fetches && len(free) >= 2 {
			// Mostly the few entries fetched last: re-fetches in the same
			// session, while the previous grant's notification may still
			// be on its way.
			h := fmt.Sprint("img-", rng.IntN(entries))
			if len(recent) > 0 && rng.IntN(2) == 0 {
				h = recent[rng.IntN(len(recent))]
			}
			if busy[h] {
				break
			}
			blocks := []int{free[len(free)-1], free[len(free)-2]}
			now := time.Now()
			if _, err := pool.Fetch(srv.Endpoint(), h, blocks, now.Add(10*time.Second), now); err != nil {
				t.Fatal(err)
			}
			free = free[:len(free)-2]
			busy[h] = true
			started++
		}
		r := pool.Step(time.Now())
		for _, d := range r.Completed {
			got := append(bytes.Clone(cr.Block(d.Blocks[0])), cr.Block(d.Blocks[1])...)
			if !bytes.Equal(got, want[d.MMHash]) {
				t.Fatalf("%s completed with other bytes", d.MMHash)
			}
			completed++
			if started < fetches && rng.IntN(2) == 0 {
				// Again at once, into the same blocks: the request leaves
				// beside the notification that ends the grant just read.
				now := time.Now()
				if _, err := pool.Fetch(srv.Endpoint(), d.MMHash, d.Blocks, now.Add(10*time.Second), now); err != nil {
					t.Fatal(err)
				}
				started++
				continue
			}
			free = append(free, d.Blocks...)
			delete(busy, d.MMHash)
			recent = append(recent, d.MMHash)
			if len(recent) > 8 {
				recent = recent[1:]
			}
		}
		for _, f := range r.Failed {
			failed = append(failed, f)
			if !f.BlocksHeld {
				free = append(free, f.Blocks...)
			}
			delete(busy, f.MMHash)
		}
		for _, rel := range r.Released {
			free = append(free, rel.Blocks...)
		}
		w, stop := context.WithTimeout(ctx, time.Millisecond)
		cli.Wait(w)
		stop()
	}
	pool.Close()
	if len(failed) > 0 {
		t.Fatalf("%d of %d fetches failed; first: %+v", len(failed), fetches, failed[0])
	}
	// Every grant ends once: by its completion (all READs completed here).
	for end := time.Now().Add(10 * time.Second); prod.Grants() > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond) // the producer's Serve loop drains notifications
	}
	st := prod.Stats()
	if st.Grants != st.Completions+st.Expired || st.Completions < fetches || prod.Grants() != 0 {
		t.Fatalf("grants %d, completions %d, expired %d, re-requests %d, live %d",
			st.Grants, st.Completions, st.Expired, st.ReRequests, prod.Grants())
	}
	for i := range entries {
		if e, _ := pc.Get(fmt.Sprint("img-", i)); e.Pins != 0 {
			t.Fatalf("img-%d still pinned %d times", i, e.Pins)
		}
	}
	if st.ReRequests == 0 {
		t.Fatal("no re-request: the test did not exercise the case")
	}
	t.Logf("%d fetches, %d grants, %d re-requests, %d completions, %d expired", fetches, st.Grants, st.ReRequests, st.Completions, st.Expired)
	cancel()
	<-served
}
