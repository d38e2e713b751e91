package connector_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// A short WaitFor ends on time, not a millisecond late: a Go timer fires
// about a millisecond late when the process is idle, so a wait under 2 ms
// sleeps on a precise timeout (ppoll's where the loop polls its sockets,
// else a timerfd).
func TestShortWaitForIsPrecise(t *testing.T) {
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 4096, NoLock: true}))
	defer region.Close()
	data := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, region))
	defer data.Close()
	cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
	defer cli.Close()
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: 4096, Logger: benchQuiet}, cli, data))
	defer pool.Close()
	ctx := context.Background()
	const d = 200 * time.Microsecond
	var took []time.Duration
	for range 200 {
		start := time.Now()
		pool.WaitFor(ctx, d)
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	med := took[len(took)/2]
	t.Logf("WaitFor(%v) on an idle pool: median %v, p90 %v", d, med, took[len(took)*9/10])
	if med > 600*time.Microsecond {
		t.Fatalf("a %v WaitFor took %v (median): a Go timer's millisecond, not the precise timer's", d, med)
	}
}
