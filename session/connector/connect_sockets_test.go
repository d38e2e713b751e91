package connector_test

import (
	"context"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// Connect over the real planes: after it, the first fetch from the
// producer completes, on one host copied out of its region under its
// published grant (the proof came with the contact); the contact's grant
// is gone, the region was described once, and no pin is left. (That the
// contact READ proves the connection for pushes is transport's
// TestContactProvesTheConnection: whether a given push lands its READ
// depends on the producer's goroutine between its ack and its push.)
func TestConnectOverTheTCPPlane(t *testing.T) {
	for _, data := range []string{"tcp", "shm"} {
		t.Run(data, func(t *testing.T) {
			ep, _, stop, err := startBenchProducer(4, 4096, data, "", "")
			if err != nil {
				t.Fatal(err)
			}
			prod := lastProducer
			defer stop()
			region := must(cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: 4096, NoLock: true}))
			defer region.Close()
			cdata := must(transport.NewTCPData(transport.TCPConfig{Logger: benchQuiet}, region))
			defer cdata.Close()
			cli := transport.NewClient(transport.ClientConfig{Logger: benchQuiet})
			defer cli.Close()
			pool := must(connector.NewPool(connector.PoolConfig{CompatHash: "bench", BlockSize: 4096, Logger: benchQuiet}, cli, cdata))
			defer pool.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := pool.Connect(ctx, ep); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if _, err := pool.Fetch(ep, benchHash(3), []int{0, 1, 2, 3}, now.Add(10*time.Second), now); err != nil {
				t.Fatal(err)
			}
			for pool.InFlight() > 0 && pool.Wait(ctx) {
				if r := pool.Step(time.Now()); len(r.Failed) > 0 {
					t.Fatalf("%+v", r.Failed[0])
				}
			}
			want := make([]byte, 4096)
			for j := range 4 {
				benchFill(want, 3, j)
				if string(region.Block(j)) != string(want) {
					t.Fatalf("block %d: bytes differ", j)
				}
			}
			st := cdata.Stats()
			if data == "shm" && st.BoardCopies != 1 {
				t.Fatalf("the first fetch was not copied under its published grant: %+v", st)
			}
			for end := time.Now().Add(5 * time.Second); prod.Grants() > 0; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("%d grants left; %+v", prod.Grants(), prod.Stats())
				}
			}
			if ps := prod.Stats(); ps.Contacts != 1 || ps.Completions != 2 || ps.DescsSent+ps.ShapesSent != 1 {
				t.Fatalf("producer %+v", ps)
			}
		})
	}
}
