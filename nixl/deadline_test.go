//go:build nixlfake

package nixl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/faultproxy"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer"
)

// A Pool and a connector.Producer over NIXL (the C fake) and the real
// control plane, behind a fault proxy. NIXL cannot stop a READ for
// certain: a fetch ended while its READ runs holds its blocks until the
// READ ends.

const (
	poolItems  = 8
	poolBlocks = 4
	poolBS     = 4096
	poolCompat = "nixl-pool"
)

var poolQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type poolWorld struct {
	t       *testing.T
	ctl     *faultproxy.Proxy
	prod    *connector.Producer
	pool    *connector.Pool
	cdata   *Agent
	cregion *cache.Region
	ep      string
	next    int
}

func newPoolWorld(t *testing.T) *poolWorld {
	w := &poolWorld{t: t}
	pregion := must(cache.NewRegion(cache.RegionConfig{Blocks: poolItems * poolBlocks, BlockSize: poolBS, NoLock: true}))
	t.Cleanup(func() { pregion.Close() })
	entries := cache.NewEmbeddingCache(pregion.Blocks())
	for i := range poolItems {
		e := must(entries.Alloc(fmt.Sprint(i), poolBlocks))
		for j, b := range e.Blocks {
			xfertestFill(pregion.Block(b), byte(i*poolBlocks+j))
		}
		entries.MarkReady(fmt.Sprint(i))
	}
	pdata := must(New(Config{Name: fmt.Sprintf("pool-p-%d", seq.Add(1))}, pregion))
	t.Cleanup(func() { pdata.Close() })
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: poolQuiet,
		PingInterval: 100 * time.Millisecond, PeerTimeout: 500 * time.Millisecond}))
	t.Cleanup(func() { srv.Close() })
	w.ctl = must(faultproxy.New(srv.Addr().String()))
	t.Cleanup(func() { w.ctl.Close() })
	w.ep = "tcp://" + w.ctl.Addr()
	// A long lease: only the consumer's notification ends a grant soon.
	w.prod = must(connector.NewProducer(connector.ProducerConfig{CompatHash: poolCompat, PinLease: 30 * time.Second,
		MaxPinnedShare: 1, Logger: poolQuiet}, srv, pdata, entries))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { w.prod.Serve(ctx); close(served) }()
	t.Cleanup(func() { cancel(); <-served; w.prod.Close() })

	w.cregion = must(cache.NewRegion(cache.RegionConfig{Blocks: 4 * poolItems * poolBlocks, BlockSize: poolBS, NoLock: true}))
	t.Cleanup(func() { w.cregion.Close() })
	w.cdata = must(New(Config{Name: fmt.Sprintf("pool-c-%d", seq.Add(1))}, w.cregion))
	cli := transport.NewClient(transport.ClientConfig{Logger: poolQuiet, PingInterval: 100 * time.Millisecond,
		PeerTimeout: 500 * time.Millisecond, ConnectTimeout: time.Second, HandshakeTimeout: time.Second})
	w.pool = must(connector.NewPool(connector.PoolConfig{CompatHash: poolCompat, BlockSize: poolBS, Logger: poolQuiet,
		AckTimeout: 500 * time.Millisecond, Retry: connector.RetryConfig{MaxAttempts: 1000, MaxElapsed: time.Minute}}, cli, w.cdata))
	t.Cleanup(func() { w.pool.Close(); w.cdata.Close(); cli.Close() })
	return w
}

func (w *poolWorld) blocks(n int) []int {
	ids := make([]int, n)
	for j := range ids {
		ids[j] = w.next
		w.next++
	}
	return ids
}

// step waits for work and steps the pool on the real clock; it fails the
// test once 10 s have passed since start.
func (w *poolWorld) step(start time.Time) (*connector.Results, time.Time) {
	w.t.Helper()
	if time.Since(start) > 10*time.Second {
		w.t.Fatal("nothing ended within 10 s")
	}
	w.pool.WaitFor(context.Background(), 5*time.Millisecond)
	now := time.Now()
	return w.pool.Step(now), now
}

// fetchOK fetches item and fails the test unless it completes with the
// producer's bytes.
func (w *poolWorld) fetchOK(item int) {
	w.t.Helper()
	start := time.Now()
	ids := w.blocks(poolBlocks)
	if _, err := w.pool.Fetch(w.ep, fmt.Sprint(item), ids, start.Add(10*time.Second), start); err != nil {
		w.t.Fatal(err)
	}
	for {
		r, _ := w.step(start)
		if len(r.Failed) > 0 {
			w.t.Fatalf("fetch of %d failed: %v", item, r.Failed[0].Err)
		}
		if len(r.Completed) > 0 {
			break
		}
	}
	want := make([]byte, poolBS)
	for j, b := range ids {
		xfertestFill(want, byte(item*poolBlocks+j))
		if !bytes.Equal(w.cregion.Block(b), want) {
			w.t.Fatalf("item %d block %d: bytes differ", item, j)
		}
	}
}

// hungFetch fetches item with every READ hanging (fakeSetHang, which the
// caller lifts), and returns its failure: at its deadline, 300 ms on (by
// 150 ms past it, room for a step on a loaded machine), or, for
// xfer.PeerDown, at once when the producer goes silent past the peer
// timeout (500 ms; by 300 ms past that) with the READ posted.
func (w *poolWorld) hungFetch(item string, why xfer.Reason) connector.Failure {
	t := w.t
	t.Helper()
	fakeSetHang(true)
	const budget = 300 * time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	if why == xfer.DeadlineExceeded {
		deadline = time.Now().Add(budget)
	}
	grants := w.prod.Stats().Grants
	start := time.Now()
	if _, err := w.pool.Fetch(w.ep, item, w.blocks(poolBlocks), deadline, start); err != nil {
		t.Fatal(err)
	}
	var stopped time.Time
	var f connector.Failure
	var at time.Time
	for f.MMHash == "" {
		r, now := w.step(start)
		if len(r.Completed) > 0 {
			t.Fatal("the hung READ completed")
		}
		if len(r.Failed) > 0 {
			f, at = r.Failed[0], now
		}
		if why == xfer.PeerDown && stopped.IsZero() && w.prod.Stats().Grants > grants {
			w.ctl.Blackhole(true) // the producer stops with the READ posted
			stopped = time.Now()
		}
	}
	if f.Reason != why || !errors.Is(f.Err, why) || !f.BlocksHeld {
		t.Fatalf("failure %+v (%v)", f, f.Err)
	}
	switch why {
	case xfer.DeadlineExceeded:
		if at.Before(deadline) || at.After(deadline.Add(150*time.Millisecond)) {
			t.Fatalf("ended at +%v, deadline +%v", at.Sub(start), budget)
		}
	case xfer.PeerDown:
		if !errors.Is(f.Err, xfer.ErrPeerSilent) || stopped.IsZero() || at.Sub(stopped) > 800*time.Millisecond {
			t.Fatalf("ended %v after the producer stopped: %v", at.Sub(stopped), f.Err)
		}
	}
	return f
}

// A fetch whose READ hangs ends at its deadline, or when its producer goes
// silent, with its blocks held (see hungFetch). Once the READ ends they
// come back in Released, not forced, and nothing writes into them after.
func TestPoolEndsHungReadHeld(t *testing.T) {
	for _, tc := range []struct {
		name string
		why  xfer.Reason
	}{{"deadline", xfer.DeadlineExceeded}, {"producer-silent", xfer.PeerDown}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newPoolWorld(t)
			w.fetchOK(0)
			defer fakeSetHang(false) // before the agents close
			start := time.Now()
			w.hungFetch("1", tc.why)
			for range 10 {
				if r, _ := w.step(start); len(r.Released) > 0 {
					t.Fatalf("released while the READ hangs: %+v", r.Released)
				}
			}
			fakeSetHang(false)
			var rel connector.Released
			for rel.MMHash == "" {
				r, _ := w.step(start)
				if len(r.Released) > 0 {
					rel = r.Released[0]
				}
			}
			if rel.MMHash != "1" || rel.Forced || len(rel.Blocks) != poolBlocks {
				t.Fatalf("released %+v", rel)
			}
			canary := bytes.Repeat([]byte{0xa5}, poolBS)
			for _, b := range rel.Blocks {
				copy(w.cregion.Block(b), canary)
			}
			w.ctl.Blackhole(false)
			w.fetchOK(2)
			w.pool.Close()
			w.cdata.Close() // nothing writes after this
			for _, b := range rel.Blocks {
				if !bytes.Equal(w.cregion.Block(b), canary) {
					t.Fatalf("block %d was written after it came back", b)
				}
			}
		})
	}
}

// Agent.Notify delivers a notification with no READ (genNotif), which the
// producer's agent drains from the consumer's agent.
func TestNotifyIsDrained(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		for _, sync := range []bool{false, true} {
			t.Run(fmt.Sprint("sync=", sync), func(t *testing.T) {
				name := fmt.Sprintf("notify-c-%d", seq.Add(1))
				c, _ := newAgent(t, v, 8, 64, Config{Name: name, SyncPost: sync})
				p, _ := newAgent(t, v, 8, 64, Config{})
				peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
				if err != nil {
					t.Fatal(err)
				}
				msg := []byte("sid:hash|grant")
				if err := c.Notify(peer.Agent, msg); err != nil {
					t.Fatal(err)
				}
				var got []xfer.Notif
				for end := time.Now().Add(5 * time.Second); len(got) == 0; time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Fatal("no notification drained within 5 s")
					}
					if got, err = p.DrainNotifs(got); err != nil {
						t.Fatal(err)
					}
				}
				if len(got) != 1 || !bytes.Equal(got[0].Msg, msg) || got[0].Agent != name {
					t.Fatalf("drained %+v, want %q from %s", got, msg, name)
				}
				if err := c.Notify("nobody", msg); !errors.Is(err, xfer.ErrUnknownPeer) {
					t.Fatalf("notify of an unknown agent: %v", err)
				}
			})
		}
	})
}

// A grant the consumer will not READ over NIXL (its ack does not fit, or
// answers a cancelled fetch) is given back by genNotif: the producer
// unpins within 2 s (its lease is 30 s).
func TestUnreadGrantGivenBackOverNIXL(t *testing.T) {
	for _, how := range []string{"bad-fit", "cancelled"} {
		t.Run(how, func(t *testing.T) {
			w := newPoolWorld(t)
			w.fetchOK(0)
			for end := time.Now().Add(2 * time.Second); w.prod.Grants() > 0; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the first fetch's grant still held 2 s after it completed")
				}
			}
			before := w.prod.Stats()
			start := time.Now()
			n := poolBlocks
			if how == "bad-fit" {
				n-- // fewer blocks than the entry has
			}
			if _, err := w.pool.Fetch(w.ep, "1", w.blocks(n), start.Add(10*time.Second), start); err != nil {
				t.Fatal(err)
			}
			ended := false
			if how == "cancelled" {
				if f, err := w.pool.Cancel("1", start); err != nil || f.BlocksHeld {
					t.Fatalf("cancel: %+v, %v", f, err)
				}
				ended = true
			}
			var granted time.Time
			for !ended || granted.IsZero() || w.prod.Grants() > 0 {
				if granted.IsZero() && w.prod.Stats().Grants > before.Grants {
					granted = time.Now()
				}
				if !granted.IsZero() && time.Since(granted) > 2*time.Second {
					t.Fatalf("the grant still holds its pin 2 s after it was made; producer %+v", w.prod.Stats())
				}
				r, _ := w.step(start)
				for _, f := range r.Failed {
					if f.Reason != xfer.BadAck || f.BlocksHeld {
						t.Fatalf("failure %+v (%v)", f, f.Err)
					}
					ended = true
				}
				if len(r.Completed) > 0 {
					t.Fatal("completed")
				}
			}
			st := w.prod.Stats()
			if st.Completions != before.Completions+1 || st.Expired != 0 || st.UnknownNotifs != 0 || st.BadTokens != 0 {
				t.Fatalf("producer %+v; before %+v", st, before)
			}
			t.Logf("unpinned %v after the grant", time.Since(granted).Round(time.Millisecond))
			w.fetchOK(2)
		})
	}
}
