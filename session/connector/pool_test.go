package connector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

var (
	quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
	t0    = time.Unix(1_700_000_000, 0)
)

const compat = "compat"

// memCtl is an in-memory control plane between a Pool and producers.
type memCtl struct {
	out     map[string][][]byte // addr -> requests not yet delivered
	in      []xfer.Inbound
	dead    []xfer.Death
	removed []string
	sendErr error
}

func (m *memCtl) Send(addr string, p []byte) error {
	if m.sendErr != nil {
		return m.sendErr
	}
	m.out[addr] = append(m.out[addr], bytes.Clone(p))
	return nil
}
func (m *memCtl) Drain(dst []xfer.Inbound) []xfer.Inbound {
	dst = append(dst, m.in...)
	m.in = nil
	return dst
}
func (m *memCtl) Dead(dst []xfer.Death) []xfer.Death {
	dst = append(dst, m.dead...)
	m.dead = nil
	return dst
}
func (m *memCtl) Remove(addr string) { m.removed = append(m.removed, addr) }
func (m *memCtl) Wait(ctx context.Context) bool {
	if len(m.in) > 0 || len(m.dead) > 0 {
		return true
	}
	<-ctx.Done()
	return false
}

type replier struct {
	m    *memCtl
	addr string
}

func (r replier) Reply(_, p []byte) error {
	r.m.in = append(r.m.in, xfer.Inbound{Addr: r.addr, Payload: bytes.Clone(p)})
	return nil
}

type world struct {
	ctl   *memCtl
	fab   *xfake.Fabric
	cdata *xfake.Fake
	pdata *xfake.Fake
	cache *cache.EmbeddingCache
	prod  *session.ProducerSession
	pool  *Pool
	now   time.Time
	// failed collects every failure step has seen.
	failed []Failure
}

const addr = "tcp://producer:1"

func newWorld(t *testing.T, cfg PoolConfig) *world {
	t.Helper()
	w := &world{ctl: &memCtl{out: map[string][][]byte{}}, fab: xfake.NewFabric(), cache: cache.NewEmbeddingCache(64), now: t0}
	w.cdata, w.pdata = w.fab.New("cons", 64, 8), w.fab.New("prod", 64, 8)
	w.prod = must(session.NewProducerSession(session.ProducerConfig{Logger: quiet}, w.pdata, w.cache, compat))
	cfg.CompatHash, cfg.Logger, cfg.Seed, cfg.BlockSize = compat, quiet, 1, 8
	w.pool = must(NewPool(cfg, w.ctl, w.cdata))
	return w
}

func (w *world) entry(t *testing.T, h string, n int, ready bool) {
	t.Helper()
	if _, err := w.cache.Alloc(h, n); err != nil {
		t.Fatal(err)
	}
	if ready {
		w.cache.MarkReady(h)
	}
}

// step advances the clock by d, runs the producer on what was sent, then the
// pool, and returns a copy of the pool's results.
func (w *world) step(d time.Duration) Results {
	w.now = w.now.Add(d)
	var msgs []xfer.Message
	for _, p := range w.ctl.out[addr] {
		msgs = append(msgs, xfer.Message{Identity: []byte("c"), Payload: p})
	}
	delete(w.ctl.out, addr)
	w.prod.Poll(msgs, replier{w.ctl, addr}, w.now)
	r := w.pool.Step(w.now)
	w.failed = append(w.failed, r.Failed...)
	return Results{slices.Clone(r.Completed), slices.Clone(r.Failed), slices.Clone(r.Released)}
}

func (w *world) until(t *testing.T, d time.Duration, n int, done func(Results) bool) Results {
	t.Helper()
	var all Results
	for range n {
		r := w.step(d)
		all.Completed = append(all.Completed, r.Completed...)
		all.Failed = append(all.Failed, r.Failed...)
		all.Released = append(all.Released, r.Released...)
		if done(all) {
			return all
		}
	}
	t.Fatalf("not done after %d steps: %+v", n, all)
	return all
}

func TestPoolFetch(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	if _, err := w.pool.Fetch(addr, "H", []int{5, 6}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	if joined, err := w.pool.Fetch(addr, "H", []int{7, 8}, w.now.Add(time.Minute), w.now); !joined || err != nil {
		t.Fatalf("second fetch: %v", err)
	}
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 })
	if len(r.Completed) != 1 || !slices.Equal(r.Completed[0].Blocks, []int{5, 6}) || r.Completed[0].Latency <= 0 {
		t.Fatalf("%+v", r)
	}
	st := w.pool.Stats()
	if st.Fetches != 1 || st.Joined != 1 || st.Completed != 1 || st.BytesMoved != 16 || st.Latency.N != 1 {
		t.Fatalf("stats %+v", st)
	}
	if w.pool.InFlight() != 0 {
		t.Fatal("in flight")
	}
}

// NOT_READY is retried with backoff until the save lands.
func TestPoolRetryNotReady(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 100 * time.Millisecond}})
	w.entry(t, "H", 1, false)
	w.pool.Fetch(addr, "H", []int{1}, w.now.Add(time.Minute), w.now)
	w.step(time.Millisecond)
	w.step(time.Millisecond) // the NACK lands: a retry is planned for ~100 ms later
	if st := w.pool.Stats(); st.Retries != 1 || st.Nacks[wire.NackNotReady] != 1 {
		t.Fatalf("stats %+v", st)
	}
	w.step(50 * time.Millisecond)
	if len(w.ctl.out[addr]) != 0 {
		t.Fatal("retried before the backoff")
	}
	w.cache.MarkReady("H")
	r := w.until(t, 20*time.Millisecond, 50, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	if len(r.Completed) != 1 {
		t.Fatalf("%+v", r)
	}
}

// A save that never lands: the budget runs out and the fetch fails, so the
// caller falls back instead of deferring forever.
func TestPoolRetryBudget(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{MaxAttempts: 3, BaseBackoff: 10 * time.Millisecond}})
	w.entry(t, "H", 1, false)
	w.pool.Fetch(addr, "H", []int{1}, w.now.Add(time.Minute), w.now)
	r := w.until(t, 10*time.Millisecond, 100, func(r Results) bool { return len(r.Failed) > 0 })
	f := r.Failed[0]
	if f.Reason != xfer.Nacked || f.Status != wire.NackNotReady || f.BlocksHeld || w.pool.Stats().Retries != 2 {
		t.Fatalf("%+v, retries %d", f, w.pool.Stats().Retries)
	}
	if w.prod.Stats().Requests != 3 {
		t.Fatalf("%d requests, want 3", w.prod.Stats().Requests)
	}
}

func TestPoolTerminalNack(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.pool.Fetch(addr, "absent", []int{1}, w.now.Add(time.Minute), w.now)
	r := w.until(t, time.Millisecond, 5, func(r Results) bool { return len(r.Failed) > 0 })
	if r.Failed[0].Status != wire.NackMissing || w.pool.Stats().Retries != 0 {
		t.Fatalf("%+v", r.Failed[0])
	}
}

// A producer's control connection dies while a READ is running: the READ
// runs on, on its data connection, and a READ that completes is a
// completed fetch; the dead connection's session lives on until it ends.
// A new fetch meanwhile uses a new session.
func TestPoolPeerDeathDuringRead(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 1, true)
	w.entry(t, "G", 1, true)
	e, _ := w.cache.Get("H")
	copy(w.pdata.Block(e.Blocks[0]), "entry H!")
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck})
	w.pool.Fetch(addr, "H", []int{3}, w.now.Add(time.Minute), w.now)
	w.step(time.Millisecond)
	w.step(time.Millisecond) // READ posted, stuck
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed})
	if r := w.step(time.Millisecond); len(r.Completed)+len(r.Failed)+len(r.Released) != 0 {
		t.Fatalf("judged at the control connection's death: %+v", r)
	}
	// A fetch to the same address starts on a fresh session.
	w.pool.Fetch(addr, "G", []int{4}, w.now.Add(time.Minute), w.now)
	r := w.until(t, time.Millisecond, 10, func(r Results) bool { return len(r.Completed) > 0 })
	if r.Completed[0].MMHash != "G" || len(r.Failed) != 0 {
		t.Fatalf("%+v", r)
	}
	w.cdata.Finish(w.cdata.Posts()[0].Handle)
	r = w.until(t, time.Millisecond, 5, func(r Results) bool { return len(r.Completed) > 0 })
	if r.Completed[0].MMHash != "H" || !slices.Equal(r.Completed[0].Blocks, []int{3}) || len(r.Failed)+len(r.Released) != 0 {
		t.Fatalf("%+v", r)
	}
	if string(w.cdata.Block(3)) != "entry H!" {
		t.Fatalf("completed with %q", w.cdata.Block(3))
	}
	if len(w.pool.draining) != 0 {
		t.Fatal("the ended session was not closed")
	}
	if st := w.pool.Stats(); st.PeerDeaths != 1 || st.Quarantines != 0 || st.Completed != 2 || st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A READ that fails after its control connection died frees its blocks
// and is asked for anew, on a new session.
func TestPoolPeerDeathThenReadFails(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 1, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck})
	w.pool.Fetch(addr, "H", []int{3}, w.now.Add(time.Minute), w.now)
	w.step(time.Millisecond)
	w.step(time.Millisecond)
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed})
	w.step(time.Millisecond)
	w.cdata.FailRead(w.cdata.Posts()[0].Handle)
	r := w.until(t, 10*time.Millisecond, 20, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	if len(r.Completed) != 1 || len(r.Failed) != 0 || w.pool.Stats().Retries != 1 {
		t.Fatalf("%+v, stats %+v", r, w.pool.Stats())
	}
}

// A producer that dies before acking: the fetch is retried on a new
// session and completes.
func TestPoolPeerDeathBeforeAck(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: time.Millisecond}})
	w.entry(t, "H", 1, true)
	w.pool.Fetch(addr, "H", []int{3}, w.now.Add(time.Minute), w.now)
	delete(w.ctl.out, addr) // the request is lost with the producer
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed})
	r := w.until(t, 5*time.Millisecond, 20, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	if len(r.Completed) != 1 || w.pool.Stats().Retries != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestPoolSendRefused(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.ctl.sendErr = xfer.ErrNotAllowed
	if _, err := w.pool.Fetch("tcp://10.0.0.1:5555", "H", []int{1}, w.now.Add(time.Minute), w.now); !errors.Is(err, xfer.ErrNotAllowed) {
		t.Fatalf("err %v", err)
	}
	if w.pool.InFlight() != 0 {
		t.Fatal("a refused fetch is in flight")
	}
}

// A send refused because the control plane has declared the producer dead
// and no Step took the report yet: the fetch starts anyway, and its send is
// retried once the report is taken (before, Fetch returned the error and
// the caller had to know to step and try again).
func TestPoolFetchRetriesRefusedSend(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.ctl.sendErr = fmt.Errorf("wrapped: %w", xfer.ErrPeerDown)
	if joined, err := w.pool.Fetch(addr, "H", []int{1, 2}, w.now.Add(time.Minute), w.now); err != nil || joined {
		t.Fatalf("Fetch: %v, joined %v", err, joined)
	}
	if w.pool.InFlight() != 1 {
		t.Fatal("the fetch did not start")
	}
	w.ctl.sendErr = nil
	r := w.until(t, 50*time.Millisecond, 100, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	if len(r.Completed) != 1 || len(r.Failed) != 0 {
		t.Fatalf("%+v", r)
	}
	// A refusal that no retry can fit (the deadline is before the first
	// backoff ends) is returned.
	w.ctl.sendErr = xfer.ErrQueueFull
	w.entry(t, "G", 1, true)
	if _, err := w.pool.Fetch(addr, "G", []int{3}, w.now.Add(time.Millisecond), w.now); !errors.Is(err, xfer.ErrQueueFull) {
		t.Fatalf("Fetch with no time to retry: %v", err)
	}
	if w.pool.InFlight() != 0 {
		t.Fatal("a refused fetch is in flight")
	}
}

// A READ the data plane reports failed (a connection that broke) is asked
// for anew within the retry budget; one that keeps failing ends as
// read-error once the budget is spent.
func TestPoolRetriesFailedRead(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 2, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.FailAfter})
	if _, err := w.pool.Fetch(addr, "H", []int{1, 2}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	r := w.until(t, 50*time.Millisecond, 100, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	if len(r.Completed) != 1 || w.pool.Stats().Retries != 1 || len(w.cdata.Posts()) != 2 {
		t.Fatalf("%+v, %d retries, %d posts", r, w.pool.Stats().Retries, len(w.cdata.Posts()))
	}
	w.entry(t, "G", 1, true)
	w.cdata.SetOutcome(xfake.Outcome{Kind: xfake.FailAfter})
	if _, err := w.pool.Fetch(addr, "G", []int{3}, w.now.Add(time.Minute), w.now); err != nil {
		t.Fatal(err)
	}
	r = w.until(t, 100*time.Millisecond, 200, func(r Results) bool { return len(r.Completed)+len(r.Failed) > 0 })
	if len(r.Failed) != 1 || r.Failed[0].Reason != xfer.ReadError || r.Failed[0].BlocksHeld {
		t.Fatalf("%+v", r)
	}
}

func TestPoolClose(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 1, true)
	w.cdata.QueueOutcomes(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	w.pool.Fetch(addr, "H", []int{3}, w.now.Add(time.Minute), w.now)
	w.pool.Fetch(addr, "W", []int{4}, w.now.Add(time.Minute), w.now)
	w.step(time.Millisecond)
	w.step(time.Millisecond)
	if err := w.pool.Close(); err != nil {
		t.Fatal(err)
	}
	r := w.pool.Step(w.now) // what Close ended
	var held []string
	for _, f := range r.Failed {
		if f.BlocksHeld {
			held = append(held, f.MMHash)
		}
	}
	if !slices.Equal(held, []string{"H"}) || len(r.Released) != 1 || !r.Released[0].Forced {
		t.Fatalf("%+v", r)
	}
	if !slices.Equal(w.ctl.removed, []string{addr}) {
		t.Fatalf("removed %v", w.ctl.removed)
	}
	if _, err := w.pool.Fetch(addr, "X", nil, w.now, w.now); !errors.Is(err, ErrClosed) {
		t.Fatalf("fetch after close: %v", err)
	}
	if r := w.pool.Step(w.now); len(r.Failed)+len(r.Released)+len(r.Completed) != 0 {
		t.Fatalf("a later step repeats what Close ended: %+v", r)
	}
}

// An ack that arrived before its producer's death is still used: the
// fetch completes in that step instead of being retried.
func TestPoolAckBeforeDeath(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.entry(t, "H", 1, true)
	w.pool.Fetch(addr, "H", []int{3}, w.now.Add(time.Minute), w.now)
	w.ctl.dead = append(w.ctl.dead, xfer.Death{Addr: addr, Err: errClosed}) // reported in the same step as the ack
	r := w.step(time.Millisecond)
	if len(r.Completed) != 1 || w.pool.Stats().Retries != 0 || w.pool.Stats().PeerDeaths != 1 {
		t.Fatalf("%+v, stats %+v", r, w.pool.Stats())
	}
}

// A retry whose send is refused (queue full, producer down) is planned
// again, not lost: the fetch still ends. (Such a retry was once dropped
// from the retry list, and the fetch never ended.)
func TestPoolRetryRefusedIsNotLost(t *testing.T) {
	for _, refusal := range []error{xfer.ErrQueueFull, xfer.ErrPeerDown} {
		w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}})
		w.entry(t, "H", 1, false)
		w.entry(t, "G", 1, false)
		w.pool.Fetch(addr, "H", []int{1}, w.now.Add(time.Minute), w.now)
		w.pool.Fetch(addr, "G", []int{2}, w.now.Add(time.Minute), w.now)
		w.step(time.Millisecond)
		w.step(time.Millisecond) // NOT_READY: retries planned
		w.ctl.sendErr = refusal
		for range 3 {
			w.step(10 * time.Millisecond) // the retries are refused, and planned again
		}
		w.ctl.sendErr = nil
		w.cache.MarkReady("H")
		w.cache.MarkReady("G")
		r := w.until(t, 10*time.Millisecond, 100, func(r Results) bool { return len(r.Completed)+len(r.Failed) == 2 })
		if len(r.Completed) != 2 || w.pool.InFlight() != 0 {
			t.Fatalf("%v: %+v, %d in flight", refusal, r, w.pool.InFlight())
		}
	}
}

// Cancel ends one fetch. Waiting for its ack or between
// attempts: blocks free at once. A READ running on a plane that stops
// READs: free at once. On one that cannot: held, then Released when the
// READ ends.
func TestPoolCancel(t *testing.T) {
	w := newWorld(t, PoolConfig{Retry: RetryConfig{BaseBackoff: time.Second}})
	w.entry(t, "A", 1, true)
	w.entry(t, "B", 1, false)
	w.entry(t, "C", 1, true)
	w.entry(t, "D", 1, true)
	if _, err := w.pool.Cancel("A", w.now); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("cancel of nothing: %v", err)
	}
	// Waiting for the ack.
	w.pool.Fetch(addr, "A", []int{1}, w.now.Add(time.Minute), w.now)
	f, err := w.pool.Cancel("A", w.now)
	if err != nil || f.Reason != xfer.Canceled || f.BlocksHeld || w.pool.InFlight() != 0 {
		t.Fatalf("cancel while waiting: %+v %v", f, err)
	}
	// Between attempts (B is not ready: NACK_NOT_READY, retry planned).
	w.pool.Fetch(addr, "B", []int{2}, w.now.Add(time.Minute), w.now)
	w.step(time.Millisecond)
	w.step(time.Millisecond)
	if f, err := w.pool.Cancel("B", w.now); err != nil || f.Reason != xfer.Canceled || f.BlocksHeld {
		t.Fatalf("cancel between attempts: %+v %v", f, err)
	}
	// A READ that cannot be stopped: held, then released when it ends.
	w.cdata.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	w.pool.Fetch(addr, "C", []int{3}, w.now.Add(time.Minute), w.now)
	w.step(time.Millisecond)
	w.step(time.Millisecond) // the READ is posted
	f, err = w.pool.Cancel("C", w.now)
	if err != nil || !f.BlocksHeld || f.Reason != xfer.Canceled {
		t.Fatalf("cancel of a running READ: %+v %v", f, err)
	}
	if r := w.step(time.Millisecond); len(r.Released)+len(r.Failed)+len(r.Completed) != 0 {
		t.Fatalf("outcome while the READ runs: %+v", r)
	}
	posts := w.cdata.Posts()
	w.cdata.Finish(posts[len(posts)-1].Handle)
	r := w.step(time.Millisecond)
	if len(r.Released) != 1 || r.Released[0].MMHash != "C" || r.Released[0].Forced || len(r.Completed) != 0 {
		t.Fatalf("after the READ ended: %+v", r)
	}
	// A plane that stops READs: free at once.
	w.cdata.SetStopsReads(true)
	w.pool.Fetch(addr, "D", []int{4}, w.now.Add(time.Minute), w.now)
	w.step(time.Millisecond)
	w.step(time.Millisecond)
	if f, err := w.pool.Cancel("D", w.now); err != nil || f.BlocksHeld {
		t.Fatalf("cancel on a stopping plane: %+v %v", f, err)
	}
	if r := w.until(t, time.Millisecond, 3, func(Results) bool { return true }); len(r.Completed)+len(r.Failed)+len(r.Released) != 0 {
		t.Fatalf("a canceled fetch ended again: %+v", r)
	}
	if st := w.pool.Stats(); st.FailedBy[xfer.Canceled] != 4 {
		t.Fatalf("stats %+v", st.FailedBy)
	}
}

// The session of an address refused before anything was
// sent is not kept, and idle sessions are reaped with their connection.
func TestPoolForgetsAddresses(t *testing.T) {
	w := newWorld(t, PoolConfig{IdleSession: time.Minute})
	w.ctl.sendErr = xfer.ErrNotAllowed
	for i := range 100 {
		if _, err := w.pool.Fetch(fmt.Sprint("tcp://refused:", i), "X", []int{1}, w.now.Add(time.Minute), w.now); err == nil {
			t.Fatal("refused send succeeded")
		}
	}
	if n := w.pool.sessions(); n != 0 {
		t.Fatalf("%d sessions kept for refused addresses", n)
	}
	w.ctl.sendErr = nil
	w.entry(t, "H", 1, true)
	w.pool.Fetch(addr, "H", []int{1}, w.now.Add(time.Minute), w.now)
	w.until(t, time.Millisecond, 5, func(r Results) bool { return len(r.Completed) == 1 })
	w.step(30 * time.Second)
	if w.pool.sessions() != 1 {
		t.Fatal("session reaped while recently used")
	}
	w.step(31 * time.Second)
	w.step(16 * time.Second)
	if w.pool.sessions() != 0 || !slices.Contains(w.ctl.removed, addr) || w.pool.Stats().Reaped != 1 {
		t.Fatalf("idle session kept: %d sessions, removed %v", w.pool.sessions(), w.ctl.removed)
	}
	// The next fetch to the address works on a new session.
	w.pool.Fetch(addr, "H", []int{2}, w.now.Add(time.Minute), w.now)
	w.until(t, time.Millisecond, 5, func(r Results) bool { return len(r.Completed) == 1 })
}

// must returns v, panicking on err: for constructors in tests.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// WaitFor returns after its duration when nothing happens, idle or with a
// fetch in flight, over a control plane without WaitOr (the context path)
// and over the real one (the timer path); a negative one is Wait, which
// an idle pool leaves to the context.
func TestPoolWaitFor(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	cli := transport.NewClient(transport.ClientConfig{Logger: quiet})
	defer cli.Close()
	real := must(NewPool(PoolConfig{CompatHash: compat, Logger: quiet, BlockSize: 8}, cli, w.cdata))
	defer real.Close()
	for name, p := range map[string]*Pool{"memCtl": w.pool, "transport.Client": real} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if !p.WaitFor(ctx, time.Millisecond) || ctx.Err() != nil {
			t.Fatalf("%s: idle WaitFor did not return on its own", name)
		}
		cancel()
	}
	w.entry(t, "A", 1, false) // not ready: the fetch stays in flight, retrying
	if _, err := w.pool.Fetch(addr, "A", []int{0}, t0.Add(time.Hour), t0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !w.pool.WaitFor(ctx, time.Millisecond) || ctx.Err() != nil {
		t.Fatal("WaitFor with a fetch in flight did not return on its own")
	}
	idle, cancelIdle := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelIdle()
	if real.WaitFor(idle, -1) {
		t.Fatal("an idle Wait returned true with nothing to do")
	}
	// Over both real planes the context's end wakes Wait too: first an
	// idle Wait, then one with a fetch in flight (an address where nothing
	// answers).
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 8, NoLock: true}))
	defer region.Close()
	tdata := must(transport.NewTCPData(transport.TCPConfig{Logger: quiet}, region))
	defer tdata.Close()
	hooked := must(NewPool(PoolConfig{CompatHash: compat, Logger: quiet, BlockSize: 8}, cli, tdata))
	hooked.maxWait = time.Hour
	defer hooked.Close()
	for _, fetch := range []bool{false, true} {
		if fetch {
			if _, err := hooked.Fetch("tcp://127.0.0.1:1", "B", []int{0}, time.Now().Add(time.Hour), time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		type waited struct{ woke, ended bool }
		done := make(chan waited, 1)
		go func() {
			woke := hooked.Wait(ctx)
			// Whether ctx had ended is looked at as Wait returns, not once
			// the result is received, which a loaded machine may delay
			// past the context's 20 ms.
			done <- waited{woke, ctx.Err() != nil}
		}()
		select {
		case r := <-done:
			if r.woke && r.ended {
				t.Fatalf("fetch %v: Wait returned true after its context ended", fetch)
			}
			if !r.woke && !r.ended {
				t.Fatalf("fetch %v: Wait returned false with its context live", fetch)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("fetch %v: Wait did not return when its context ended", fetch)
		}
		cancel()
	}
}

// A Failure's Err matches its reason, its NACK's status and its cause.
func TestFailureErr(t *testing.T) {
	w := newWorld(t, PoolConfig{})
	w.pool.Fetch(addr, "absent", []int{1}, w.now.Add(time.Minute), w.now)
	r := w.until(t, time.Millisecond, 5, func(r Results) bool { return len(r.Failed) > 0 })
	f := r.Failed[0]
	var st wire.Status
	var why xfer.Reason
	if !errors.Is(f.Err, xfer.Nacked) || !errors.Is(f.Err, wire.NackMissing) || errors.Is(f.Err, wire.NackNotReady) ||
		!errors.As(f.Err, &st) || st != wire.NackMissing || !errors.As(f.Err, &why) || why != xfer.Nacked {
		t.Fatalf("%v: status %v, reason %v", f.Err, st, why)
	}
	if got := f.Err.Error(); !strings.Contains(got, "absent") || !strings.Contains(got, "NACK_MISSING") {
		t.Fatalf("error says %q", got)
	}

	// The producer's contact cannot be registered: the data plane's error
	// is the cause.
	w.entry(t, "H", 1, true)
	bad := errors.New("not this plane's metadata")
	w.cdata.SetAddPeerError(bad)
	w.pool.Fetch(addr, "H", []int{2}, w.now.Add(time.Minute), w.now)
	r = w.until(t, time.Millisecond, 5, func(r Results) bool { return len(r.Failed) > 0 })
	f = r.Failed[0]
	if f.Reason != xfer.RegisterFailed || !errors.Is(f.Err, xfer.RegisterFailed) || !errors.Is(f.Err, bad) ||
		!strings.Contains(f.Err.Error(), "data plane") {
		t.Fatalf("%+v", f)
	}
	w.cdata.SetAddPeerError(nil)

	w.entry(t, "C", 1, false)
	w.pool.Fetch(addr, "C", []int{3}, w.now.Add(time.Minute), w.now)
	if f, err := w.pool.Cancel("C", w.now); err != nil || !errors.Is(f.Err, xfer.Canceled) {
		t.Fatalf("cancel: %v %v", f.Err, err)
	}
}

func TestFailureCountsString(t *testing.T) {
	if got := (FailureCounts{}).String(); got != "none" {
		t.Fatalf("empty: %q", got)
	}
	c := FailureCounts{xfer.RegisterFailed: 1, xfer.Nacked: 1000, xfer.Canceled: 0}
	if got, want := c.String(), "nacked 1000, register-failed 1"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

// errClosed is a death's cause when a connection closed (not a silence).
var errClosed = errors.New("connection closed")

// A Pool closed with READs under way gives their grants back where the
// data plane stops READs: the producer unpins at once, not at its lease.
// Where a READ may still write, the grant stays until that READ ends.
func TestPoolCloseGivesBackGrants(t *testing.T) {
	for _, stops := range []bool{true, false} {
		t.Run(fmt.Sprint("stops=", stops), func(t *testing.T) {
			w := newWorld(t, PoolConfig{})
			w.cdata.SetStopsReads(stops)
			w.cdata.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
			for i, h := range []string{"A", "B"} {
				w.entry(t, h, 2, true)
				if _, err := w.pool.Fetch(addr, h, []int{2 * i, 2*i + 1}, w.now.Add(time.Minute), w.now); err != nil {
					t.Fatal(err)
				}
			}
			w.step(time.Millisecond)
			w.step(time.Millisecond) // the READs are posted
			if n := len(w.cdata.Posts()); n != 2 || w.prod.Grants() != 2 {
				t.Fatalf("%d READs posted, %d grants", n, w.prod.Grants())
			}
			w.pool.Close()
			w.step(time.Millisecond)
			st := w.prod.Stats()
			switch {
			case stops && (w.prod.Grants() != 0 || st.Completions != 2 || st.UnknownNotifs+st.BadTokens != 0):
				t.Fatalf("after Close: %d grants held; producer %+v", w.prod.Grants(), st)
			case !stops && (w.prod.Grants() != 2 || w.cdata.Notifies() != 0):
				t.Fatalf("after Close, READs running: %d grants held, %d notifications", w.prod.Grants(), w.cdata.Notifies())
			}
		})
	}
}

// waitCheckCtl is a control plane whose Wait notes whether the data plane
// was held waiting meanwhile.
type waitCheckCtl struct {
	*memCtl
	data         *holdCount
	waits, holds int
}

func (c *waitCheckCtl) Wait(ctx context.Context) bool {
	c.waits++
	if c.data.count() > 0 {
		c.holds++
	}
	return c.memCtl.Wait(ctx)
}

// A Pool that waits holds its data plane waiting (plane.Waiter) while it
// blocks, and lets go after: a plane that reads its sockets in the steps
// of the loop hands them to their goroutines while the loop sleeps.
func TestPoolWaitHoldsItsDataPlane(t *testing.T) {
	data := waitingData{xfake.New("cons", 16, 8), &holdCount{}}
	ctl := &waitCheckCtl{memCtl: &memCtl{out: map[string][][]byte{}}, data: data.holdCount}
	pool := must(NewPool(PoolConfig{CompatHash: compat, Logger: quiet, BlockSize: 8}, ctl, data))
	defer pool.Close()
	pool.Step(time.Now())
	pool.WaitFor(context.Background(), 2*time.Millisecond)
	if ctl.waits == 0 || ctl.holds != ctl.waits {
		t.Fatalf("%d of the Pool's %d waits held its data plane", ctl.holds, ctl.waits)
	}
	if data.count() != 0 {
		t.Fatal("held after the wait")
	}
}
