package connector_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
)

// BenchmarkSteppedFetch is the library's own cost per 16 × 8 KiB fetch
// over the same-host copy (shm) and over the TCP plane (tcp, the bytes
// pushed with the ack) with no machine in the way: a Producer and a
// Pool in one process, stepped one after the other by one loop that never
// waits, fetch after fetch, so that every message is read in a step and
// nothing is woken. cpu-µs/fetch is the loop's thread time (both sides:
// the three messages' system calls, the copy, the protocol), against the
// anchors in the same run: messages (the three messages' system calls
// alone) and memmove (the copy alone), as BenchmarkEngine's; steps/fetch
// counts the loop's rounds per fetch (one: nothing waited for another
// goroutine).
//
//	go test -run '^$' -bench SteppedFetch ./session/connector
func BenchmarkSteppedFetch(b *testing.B) {
	const blocks, bs = 16, 8 << 10
	b.Run("library", func(b *testing.B) { steppedFetch(b, blocks, bs, "shm") })
	b.Run("library/tcp", func(b *testing.B) { steppedFetch(b, blocks, bs, "tcp") })
	b.Run("messages", engineMessages)
	b.Run("memmove", func(b *testing.B) { engineMemmove(b, blocks, bs) })
}

func steppedFetch(b *testing.B, blocks, bs int, data string) {
	region := must(cache.NewRegion(cache.RegionConfig{Blocks: benchItems * blocks, BlockSize: bs, NoLock: true, Shared: data == "shm"}))
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks())
	for i := range benchItems {
		e := must(entries.Alloc(benchHash(i), blocks))
		for j, bl := range e.Blocks {
			benchFill(region.Block(bl), i, j)
		}
		entries.MarkReady(benchHash(i))
	}
	pdata := must(transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: benchQuiet, NoSharedMemory: data != "shm"}, region))
	defer pdata.Close()
	srv := must(transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: benchQuiet}))
	defer srv.Close()
	prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: "bench", Logger: benchQuiet}, srv, pdata, entries))
	defer prod.Close()
	pool, _ := benchPool(b, blocks, bs, data)
	ep := srv.Endpoint()
	ids := make([]int, blocks)
	for j := range ids {
		ids[j] = j
	}
	steps := 0
	fetch := func(i int) {
		now := time.Now()
		if _, err := pool.Fetch(ep, benchHash(i%benchItems), ids, now.Add(10*time.Second), now); err != nil {
			b.Fatal(err)
		}
		for {
			steps++
			now := time.Now()
			prod.Step(now)
			r := pool.Step(now)
			if len(r.Failed) > 0 {
				b.Fatalf("fetch %d: %v", i, r.Failed[0].Reason)
			}
			if len(r.Completed) > 0 {
				return
			}
		}
	}
	for i := range 2000 { // connections, mappings, first touches
		fetch(i)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	steps = 0
	b.ResetTimer()
	t0 := threadCPU()
	for i := range b.N {
		fetch(i)
	}
	b.ReportMetric(float64(threadCPU()-t0)/float64(b.N)/1e3, "cpu-µs/fetch")
	b.ReportMetric(float64(steps)/float64(b.N), "steps/fetch")
}
