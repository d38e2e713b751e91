package transport

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/churn"
)

// BenchmarkCopyAfterChurn is the same-host copy of entries whose blocks a
// producer's and a consumer's caches chose after long use
// (internal/churn, as BenchmarkAllocAfterChurn in cache): each op copies
// the producer's next new image into blocks the consumer's cache
// allocates for it, run by run as the same-host plane does (walk), out of
// 1 GiB a side so that both are cold. runs/entry: the copy's spans;
// compare copy-MB/s with BenchmarkColdCopy's 1-run.
func BenchmarkCopyAfterChurn(b *testing.B) {
	// Both workloads copy between the same two regions, touched once:
	// faulting in 2 GiB is most of what one iteration costs.
	src, dst := make([]byte, churnBlocks*churnBlock), make([]byte, churnBlocks*churnBlock)
	for i := 0; i < len(src); i += 4096 {
		src[i], dst[i] = 1, 1
	}
	for _, images := range []uint64{0, 10000} {
		name := "new-images"
		if images > 0 {
			name = "zipf-10000"
		}
		b.Run(name, func(b *testing.B) { copyAfterChurn(b, images, src, dst) })
	}
}

const churnBlock, churnBlocks = 8 << 10, 1 << 30 / (8 << 10)

func copyAfterChurn(b *testing.B, images uint64, src, dst []byte) {
	const bs, blocks = churnBlock, churnBlocks
	cc := cache.NewEmbeddingCache(blocks)
	pw, cw := churn.New(cache.NewEmbeddingCache(blocks), 1, images), churn.New(cc, 2, images)
	next := func(w *churn.Workload) cache.Entry {
		for {
			e, miss, err := w.Next()
			if err != nil {
				b.Fatal(err)
			}
			if miss {
				return e
			}
		}
	}
	for range 10000 {
		next(pw)
		next(cw)
	}
	cfg := TCPConfig{}
	w := cfg.copyWorkers()
	nspans, total, took := 0, 0, time.Duration(0)
	for i := 0; b.Loop(); i++ {
		pe := next(pw)
		next(cw)
		ce, err := cc.Alloc(fmt.Sprint("fetched-", i), len(pe.Blocks))
		if err != nil {
			b.Fatal(err)
		}
		cc.MarkReady(fmt.Sprint("fetched-", i))
		op := &readOp{remote: spans(nil, pe.Blocks), local: spans(nil, ce.Blocks)}
		var s []copySpan
		off := 0
		walk(op, bs, func(li, ri, k int) {
			s = append(s, copySpan{dst[li*bs : (li+k)*bs], src[ri*bs : (ri+k)*bs], off})
			off += k * bs
		})
		start := time.Now()
		parallelCopy(s, off, w)
		took += time.Since(start)
		nspans += len(s)
		total += off
	}
	b.ReportMetric(float64(nspans)/float64(b.N), "runs/entry")
	b.ReportMetric(float64(total)/took.Seconds()/1e6, "copy-MB/s")
}
