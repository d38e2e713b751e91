// Package hist is a fixed-size latency histogram: log-spaced buckets, no
// allocation per sample, safe to copy as a snapshot.
package hist

import (
	"math/bits"
	"time"
)

// Buckets: bucket i holds durations in [2^i, 2^(i+1)) microseconds, bucket
// 0 also everything under 1 µs, the last everything above.
const Buckets = 28 // up to about 2^27 µs = 134 s

// Histogram counts durations. The zero value is empty and ready.
type Histogram struct {
	Counts [Buckets]uint64
	N      uint64
	Sum    time.Duration
	Max    time.Duration
}

func bucket(d time.Duration) int {
	us := uint64(d / time.Microsecond)
	if us == 0 {
		return 0
	}
	return min(bits.Len64(us)-1, Buckets-1)
}

// Add records one duration.
func (h *Histogram) Add(d time.Duration) {
	h.Counts[bucket(d)]++
	h.N++
	h.Sum += d
	h.Max = max(h.Max, d)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i := range h.Counts {
		h.Counts[i] += o.Counts[i]
	}
	h.N += o.N
	h.Sum += o.Sum
	h.Max = max(h.Max, o.Max)
}

// Quantile returns an upper bound of the q-quantile (0 < q <= 1): the top
// of the bucket it falls in, capped at the largest sample.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.N == 0 {
		return 0
	}
	rank := uint64(q*float64(h.N) + 0.5)
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(uint64(2)<<i)*time.Microsecond, h.Max)
		}
	}
	return h.Max
}

// Mean returns the average sample.
func (h *Histogram) Mean() time.Duration {
	if h.N == 0 {
		return 0
	}
	return h.Sum / time.Duration(h.N)
}
