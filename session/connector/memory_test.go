package connector

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// echoCtl is a control plane whose producer grants every request at once,
// and that keeps nothing once drained.
type echoCtl struct {
	in  []xfer.Inbound
	req wireview.Req
}

func (e *echoCtl) Send(addr string, p []byte) error {
	if err := wireview.DecodeReq(p, &e.req); err != nil {
		return err
	}
	ack := wire.XferAck{MMHash: string(e.req.MMHash), Status: wire.OK, SessionID: string(e.req.SessionID),
		SrcBlockIndices: []wire.Int{wire.IntOf(1)}, AgentMetadata: []byte("meta"), Attempt: e.req.Attempt}
	e.in = append(e.in, xfer.Inbound{Addr: addr, Payload: wire.AppendAck(nil, &ack)})
	return nil
}

func (e *echoCtl) Drain(dst []xfer.Inbound) []xfer.Inbound {
	dst = append(dst, e.in...)
	e.in = nil
	return dst
}
func (e *echoCtl) Dead(dst []xfer.Death) []xfer.Death { return dst }
func (e *echoCtl) Remove(string)                      {}
func (e *echoCtl) Wait(context.Context) bool          { return true }

// instantData is a data plane whose READs are done at once, and that keeps
// nothing.
type instantData struct{ next xfer.Handle }

func (d *instantData) AgentMetadata() []byte { return nil }
func (d *instantData) MemDescriptor() []byte { return nil }
func (d *instantData) AddRemotePeer(_, _ []byte) (xfer.Peer, error) {
	return xfer.Peer{Agent: "p", Blocks: 1 << 20}, nil
}
func (d *instantData) RemoveRemotePeer(string) error { return nil }
func (d *instantData) PostRead(_ []int, _ string, _ []int, _ []byte) (xfer.Handle, error) {
	d.next++
	return d.next, nil
}
func (d *instantData) Check(xfer.Handle) (xfer.Progress, error)           { return xfer.Complete, nil }
func (d *instantData) Release(xfer.Handle) error                          { return nil }
func (d *instantData) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) { return dst, nil }
func (d *instantData) Close() error                                       { return nil }

func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// After a burst, the Pool's maps and buffers shrink back: within one
// IdleSession of steady traffic (a fetch a second) its live heap is back
// within max(512 KiB, 10 % of the burst's growth) of what it was before
// the burst; and once idle with no session left, too.
func TestPoolMemoryFollowsLoad(t *testing.T) {
	sizes := []int{10_000}
	if !testing.Short() {
		sizes = append(sizes, 100_000)
	}
	for _, burst := range sizes {
		t.Run(fmt.Sprint(burst), func(t *testing.T) {
			const idle = time.Minute
			p := must(NewPool(PoolConfig{CompatHash: compat, Logger: quiet, Seed: 1, IdleSession: idle}, &echoCtl{}, &instantData{}))
			blocks := []int{3}
			now := t0
			n := 0
			fetchOne := func() {
				n++
				if _, err := p.Fetch(addr, fmt.Sprint("steady-", n), blocks, now.Add(time.Minute), now); err != nil {
					t.Fatal(err)
				}
			}
			steady := func(d time.Duration) {
				for end := now.Add(d); now.Before(end); {
					fetchOne()
					if r := p.Step(now); len(r.Completed) != 1 {
						t.Fatalf("steady fetch: %+v", r)
					}
					now = now.Add(time.Second)
				}
			}
			steady(10 * time.Second)
			before := liveHeap()

			hashes := make([]string, burst)
			for i := range hashes {
				hashes[i] = fmt.Sprint("burst-", i)
			}
			for _, h := range hashes {
				if _, err := p.Fetch(addr, h, blocks, now.Add(time.Minute), now); err != nil {
					t.Fatal(err)
				}
			}
			peak := liveHeap() // every fetch in flight, every ack waiting
			if r := p.Step(now); len(r.Completed) != burst || p.InFlight() != 0 {
				t.Fatalf("burst: %d completed, %d in flight", len(r.Completed), p.InFlight())
			}
			hashes = nil
			growth := peak - before
			allowed := max(512<<10, growth/10)

			steady(idle)
			afterSteady := liveHeap()
			now = now.Add(2 * idle) // no traffic: the session is reaped
			p.Step(now)
			p.Step(now.Add(idle))
			afterIdle := liveHeap()
			t.Logf("burst of %d: growth %d KiB; after an IdleSession of steady traffic +%d KiB; idle with %d sessions +%d KiB (allowed %d KiB)",
				burst, growth>>10, (afterSteady-before)>>10, p.sessions(), (afterIdle-before)>>10, allowed>>10)
			if afterSteady-before > allowed {
				t.Errorf("steady traffic after the burst: %d KiB over the level before it, allowed %d KiB", (afterSteady-before)>>10, allowed>>10)
			}
			if afterIdle-before > allowed {
				t.Errorf("idle after the burst: %d KiB over the level before it, allowed %d KiB", (afterIdle-before)>>10, allowed>>10)
			}
			runtime.KeepAlive(p)
		})
	}
}
