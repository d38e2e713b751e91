package cache_test

import (
	"testing"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/churn"
)

// BenchmarkAllocAfterChurn: a cache of 4 GiB in 8 KiB blocks after long
// use (internal/churn), every image new or drawn from 10,000: the runs of
// consecutive blocks an entry comes in, the share of its bytes in runs
// under 1 MiB (which a same-host copy moves through the CPU cache), the
// hit ratio, and what one request costs.
func BenchmarkAllocAfterChurn(b *testing.B) {
	for _, images := range []uint64{0, 10000} {
		name := "new-images"
		if images > 0 {
			name = "zipf-10000"
		}
		b.Run(name, func(b *testing.B) {
			w := churn.New(cache.NewEmbeddingCache(4<<30/8192), 1, images)
			for range 50000 {
				if _, _, err := w.Next(); err != nil {
					b.Fatal(err)
				}
			}
			misses, runs, blocks, small := 0, 0, 0, 0
			b.ReportAllocs()
			for b.Loop() {
				e, miss, err := w.Next()
				if err != nil {
					b.Fatal(err)
				}
				if !miss {
					continue
				}
				misses++
				blocks += len(e.Blocks)
				for i := 0; i < len(e.Blocks); {
					j := i + 1
					for j < len(e.Blocks) && e.Blocks[j] == e.Blocks[j-1]+1 {
						j++
					}
					if runs++; j-i < 128 {
						small += j - i
					}
					i = j
				}
			}
			b.ReportMetric(float64(runs)/float64(max(misses, 1)), "runs/entry")
			b.ReportMetric(100*float64(small)/float64(max(blocks, 1)), "%-in-runs<1MiB")
			b.ReportMetric(1-float64(misses)/float64(b.N), "hit-ratio")
		})
	}
}
