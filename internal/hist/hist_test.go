package hist

import (
	"math"
	"math/rand/v2"
	"slices"
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
	if p50, p99 := h.Quantile(0.5), h.Quantile(0.99); p50 != 50*time.Millisecond+h.slack(50*time.Millisecond) || p99 != 99*time.Millisecond+h.slack(99*time.Millisecond) {
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
		t.Fatalf("N %d first %d last %d max %v", g.N, g.Counts[0], g.Counts[Buckets-1], g.Max)
	}
	if g.Quantile(1) != time.Hour {
		t.Fatalf("p100 %v", g.Quantile(1))
	}
}

// slack is how far above d the quantile of a sample d reads: the rest of
// its bucket.
func (h *Histogram) slack(d time.Duration) time.Duration {
	return Upper(Bucket(d)) - 1 - d
}

// The quantiles of samples from several distributions come within 1 % of
// the exact ones, never under them.
func TestQuantileWithinOnePercent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dists := map[string]func() time.Duration{
		"uniform 1µs-10ms": func() time.Duration { return time.Microsecond + time.Duration(r.Int64N(int64(10*time.Millisecond))) },
		"exponential 1ms":  func() time.Duration { return time.Duration(r.ExpFloat64() * float64(time.Millisecond)) },
		"lognormal": func() time.Duration {
			return time.Duration(math.Exp(r.NormFloat64()*2) * float64(200*time.Microsecond))
		},
		"bimodal": func() time.Duration {
			if r.IntN(100) == 0 {
				return 1100*time.Microsecond + time.Duration(r.Int64N(int64(50*time.Microsecond)))
			}
			return 80*time.Microsecond + time.Duration(r.Int64N(int64(20*time.Microsecond)))
		},
		"nanoseconds": func() time.Duration { return time.Duration(r.Int64N(5000)) },
		"seconds":     func() time.Duration { return time.Duration(r.Int64N(int64(100 * time.Second))) },
	}
	for name, next := range dists {
		for _, n := range []int{1, 7, 100, 10000} {
			var h Histogram
			s := make([]time.Duration, n)
			for i := range s {
				s[i] = next()
				h.Add(s[i])
			}
			slices.Sort(s)
			for _, q := range []float64{0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1} {
				rank := max(int(q*float64(n)+0.5), 1)
				exact, got := s[rank-1], h.Quantile(q)
				if got < exact || float64(got-exact) > 0.01*float64(exact) {
					t.Errorf("%s, %d samples: p%v %v, exact %v", name, n, q*100, got, exact)
				}
			}
		}
	}
}

func TestBuckets(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		d := time.Duration(r.Int64N(1 << r.IntN(39)))
		i := Bucket(d)
		if lo, hi := Lower(i), Upper(i); d < lo || d >= hi || float64(hi-lo) > float64(lo)/128+1 {
			t.Fatalf("%v in bucket %d [%v, %v)", d, i, lo, hi)
		}
	}
	for i := range Buckets - 1 {
		if Upper(i) <= Lower(i) || Bucket(Lower(i)) != i || Bucket(Upper(i)-1) != i {
			t.Fatalf("bucket %d [%v, %v)", i, Lower(i), Upper(i))
		}
	}
	// Power-of-two microseconds are bucket edges, for exporters that keep
	// those bounds.
	for e := range 28 {
		d := time.Duration(1<<e) * time.Microsecond
		if Lower(Bucket(d)) != d {
			t.Fatalf("%v is not a bucket edge", d)
		}
	}
	if Bucket(-time.Second) != 0 || Bucket(time.Hour) != Buckets-1 {
		t.Fatal("out of range")
	}
}

func TestAddDoesNotAllocate(t *testing.T) {
	h := new(Histogram)
	if n := testing.AllocsPerRun(100, func() { h.Add(1234 * time.Microsecond) }); n != 0 {
		t.Fatalf("%v allocations per Add", n)
	}
}
