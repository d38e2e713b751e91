package hist

import (
	"testing"
	"time"
)

func TestHistogram(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Mean() != 0 {
		t.Fatal("empty histogram")
	}
	for i := 1; i <= 100; i++ {
		h.Add(time.Duration(i) * time.Millisecond)
	}
	p50, p99 := h.Quantile(0.5), h.Quantile(0.99)
	// Upper bounds within a factor of two of the true values.
	if p50 < 50*time.Millisecond || p50 > 100*time.Millisecond || p99 < 99*time.Millisecond || p99 > 100*time.Millisecond {
		t.Fatalf("p50 %v p99 %v", p50, p99)
	}
	if h.Mean() != 50500*time.Microsecond || h.Max != 100*time.Millisecond {
		t.Fatalf("mean %v max %v", h.Mean(), h.Max)
	}
	var g Histogram
	g.Add(0)
	g.Add(time.Hour)
	g.Merge(&h)
	if g.N != 102 || g.Counts[0] != 1 || g.Counts[Buckets-1] != 1 || g.Max != time.Hour {
		t.Fatalf("%+v", g)
	}
}
