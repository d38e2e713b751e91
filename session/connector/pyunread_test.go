package connector_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer"
)

// pyWorld is a Pool fetching from a Python producer's control plane (the
// reference's acks: no grant id, token or lease) whose data-plane agent is
// a TCP data plane here, serving every READ, that stands in for its NIXL
// agent: the notifications the consumer sends it are drained here.
type pyWorld struct {
	*consumer
	pdata *transport.TCPData
	reqs  chan [2]string // session id, mm_hash of each request, as the producer saw it
}

func newPyWorld(t *testing.T, delay time.Duration, pc connector.PoolConfig) *pyWorld {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI needs python3-zmq and python3-msgpack: %v", err)
		}
		t.Skipf("python3-zmq or python3-msgpack missing: %v", err)
	}
	w := &pyWorld{reqs: make(chan [2]string, 16)}
	pregion := must(cache.NewRegion(cache.RegionConfig{Blocks: faultBlocks, BlockSize: faultBS, NoLock: true}))
	t.Cleanup(func() { pregion.Close() })
	for j := range faultBlocks {
		benchFill(pregion.Block(j), 0, j)
	}
	w.pdata = must(transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", NoSharedMemory: true, Logger: benchQuiet,
		Authorize: func(string, []byte, []int) (func(), bool) { return func() {}, true }}, pregion))
	t.Cleanup(func() { w.pdata.Close() })
	ep := "tcp://" + freeAddr(t)
	cmd := exec.Command(python, filepath.Join("testdata", "py_granting_producer.py"), ep, "bench",
		hex.EncodeToString(w.pdata.AgentMetadata()), fmt.Sprint(faultBlocks), fmt.Sprint(delay.Milliseconds()))
	out := must(cmd.StdoutPipe())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("python producer: %q %v", lines.Text(), lines.Err())
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		for lines.Scan() {
			if f := strings.Fields(lines.Text()); len(f) == 3 && f[0] == "req" {
				w.reqs <- [2]string{f[1], f[2]}
			}
		}
	}()
	t.Cleanup(func() { cmd.Process.Kill(); <-read; cmd.Wait() })

	c := &consumer{t: t, endpoint: ep}
	c.cregion = must(cache.NewRegion(cache.RegionConfig{Blocks: 64, BlockSize: faultBS, NoLock: true}))
	t.Cleanup(func() { c.cregion.Close() })
	c.cdata = must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, c.cregion))
	c.cli = transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
	pc.CompatHash, pc.BlockSize, pc.Logger = "bench", faultBS, benchQuiet
	c.pool = must(connector.NewPool(pc, c.cli, c.cdata))
	t.Cleanup(func() { c.pool.Close(); c.cdata.Close(); c.cli.Close() })
	w.consumer = c
	return w
}

// stepFor steps the pool for d, handing back the blocks of what ended,
// and returns the outcomes and the notifications the producer's agent
// received meanwhile.
func (w *pyWorld) stepFor(d time.Duration, until func(notifs []xfer.Notif) bool) (done []connector.Done, failed []connector.Failure, notifs []xfer.Notif) {
	end := time.Now().Add(d)
	for time.Now().Before(end) && (until == nil || !until(notifs)) {
		w.pool.WaitFor(context.Background(), 5*time.Millisecond)
		r := w.pool.Step(time.Now())
		done = append(done, r.Completed...)
		for _, f := range r.Failed {
			failed = append(failed, f)
			if !f.BlocksHeld {
				w.canary(f.Blocks)
			}
		}
		for _, rel := range r.Released {
			w.canary(rel.Blocks)
		}
		notifs = must(w.pdata.DrainNotifs(notifs))
	}
	return done, failed, notifs
}

// request returns the next request the producer saw, failing the test if
// none comes within 2 s.
func (w *pyWorld) request() [2]string {
	w.t.Helper()
	select {
	case r := <-w.reqs:
		return r
	case <-time.After(2 * time.Second):
		w.t.Fatal("the producer saw no request")
		return [2]string{}
	}
}

// The reference's grants the consumer will not READ are given back too:
// the notification "<session_id>:<mm_hash>" reaches the producer's agent
// at once (within 2 s here; its lease is 30 s), for an ack that does not
// fit, one that answers a cancelled fetch, and one that comes past the
// consumer's PinLease (the reference's ack states no lease: the
// consumer's own is the bound).
func TestUnreadGrantsOfAPythonProducer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Python producer")
	}
	cases := []struct {
		name  string
		delay time.Duration // before each ack
		pool  connector.PoolConfig
		local int // blocks fetched into
		fetch func(t *testing.T, w *pyWorld, ids []int)
		why   xfer.Reason // the failure Step reports; zero: none (Cancel did)
	}{
		{name: "bad-fit", local: faultBlocks - 1, why: xfer.BadAck},
		{name: "cancelled", local: faultBlocks, fetch: func(t *testing.T, w *pyWorld, ids []int) {
			if f, err := w.pool.Cancel("H", time.Now()); err != nil || f.Reason != xfer.Canceled || f.BlocksHeld {
				t.Fatalf("cancel: %+v, %v", f, err)
			}
			w.canary(ids)
		}},
		{name: "past-lease", delay: 400 * time.Millisecond, local: faultBlocks, why: xfer.LateCompletion,
			pool: connector.PoolConfig{AckTimeout: 5 * time.Second, Xfer: xfer.Config{PinLease: 200 * time.Millisecond},
				Retry: connector.RetryConfig{MaxAttempts: 1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newPyWorld(t, tc.delay, tc.pool)
			ids := w.blocks(tc.local)
			now := time.Now()
			if _, err := w.pool.Fetch(w.endpoint, "H", ids, now.Add(10*time.Second), now); err != nil {
				t.Fatal(err)
			}
			if tc.fetch != nil {
				tc.fetch(t, w, ids)
			}
			done, failed, notifs := w.stepFor(2*time.Second, func(n []xfer.Notif) bool { return len(n) > 0 })
			req := w.request()
			if len(done) != 0 {
				t.Fatalf("completed: %+v", done)
			}
			if tc.why != 0 && (len(failed) != 1 || failed[0].Reason != tc.why || failed[0].BlocksHeld) {
				t.Fatalf("failed %+v, want %v", failed, tc.why)
			}
			if tc.why == 0 && len(failed) != 0 {
				t.Fatalf("failed after the cancel: %+v", failed)
			}
			if len(notifs) != 1 || string(notifs[0].Msg) != req[0]+":H" {
				t.Fatalf("notifications %+v, want one %q within 2 s", notifs, req[0]+":H")
			}
			w.closeAndCheck()
		})
	}
}

// A fetch from the reference's producer cancelled and asked again at once
// does not trip the consumer: the cancelled fetch's grant is given back
// (its notification sent as its ack comes, before the second request goes:
// that one waits for the producer's first answer), and the second fetch
// completes with the producer's bytes, its READ notifying once.
func TestPythonProducerCancelThenRefetch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Python producer")
	}
	w := newPyWorld(t, 0, connector.PoolConfig{})
	now := time.Now()
	first := w.blocks(faultBlocks)
	if _, err := w.pool.Fetch(w.endpoint, "H", first, now.Add(10*time.Second), now); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Cancel("H", now); err != nil {
		t.Fatal(err)
	}
	w.canary(first)
	second := w.blocks(faultBlocks)
	if _, err := w.pool.Fetch(w.endpoint, "H", second, now.Add(10*time.Second), now); err != nil {
		t.Fatal(err)
	}
	var done []connector.Done
	var failed []connector.Failure
	var notifs []xfer.Notif
	for end := time.Now().Add(2 * time.Second); len(done)+len(failed) == 0 && time.Now().Before(end); {
		d, f, n := w.stepFor(10*time.Millisecond, nil)
		done, failed, notifs = append(done, d...), append(failed, f...), append(notifs, n...)
	}
	r1, r2 := w.request(), w.request()
	if r1[0] != r2[0] {
		t.Fatalf("the requests carry session ids %q and %q: the test needs one", r1[0], r2[0])
	}
	if len(failed) != 0 || len(done) != 1 || done[0].MMHash != "H" {
		t.Fatalf("completed %+v, failed %+v", done, failed)
	}
	want := make([]byte, faultBS)
	for j, b := range second {
		benchFill(want, 0, j)
		if string(w.cregion.Block(b)) != string(want) {
			t.Fatalf("block %d: bytes differ", j)
		}
	}
	_, _, more := w.stepFor(100*time.Millisecond, nil)
	notifs = append(notifs, more...)
	if len(notifs) != 2 || string(notifs[0].Msg) != r1[0]+":H" || string(notifs[1].Msg) != r1[0]+":H" {
		t.Fatalf("notifications %+v, want the unread grant's and the READ's", notifs)
	}
	w.closeAndCheck()
}
