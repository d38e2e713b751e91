package connector_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer"
)

// A fetch from a producer that refuses connections fails with the
// network's error in its Failure, not only in a log line.
func TestFailureCarriesTheNetworkError(t *testing.T) {
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 4096, NoLock: true}))
	defer region.Close()
	data := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, region))
	defer data.Close()
	cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet, ConnectTimeout: time.Second})
	defer cli.Close()
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: 4096, Logger: benchQuiet,
		Retry: connector.RetryConfig{MaxAttempts: 2}}, cli, data))
	defer pool.Close()
	now := time.Now()
	if _, err := pool.Fetch("tcp://127.0.0.1:1", "h", []int{0}, now.Add(5*time.Second), now); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for pool.InFlight() > 0 && pool.Wait(ctx) {
		if r := pool.Step(time.Now()); len(r.Failed) > 0 {
			if f := r.Failed[0]; f.Reason != xfer.PeerDown || !errors.Is(f.Err, syscall.ECONNREFUSED) {
				t.Fatalf("failure %v (reason %s)", f.Err, f.Reason)
			}
			return
		}
	}
	t.Fatal("the fetch did not fail")
}
