// Package hist is a fixed-size latency histogram: log-linear buckets fine
// enough that quantiles come within 1 % of the exact value, no allocation
// per sample, safe to copy as a snapshot.
package hist

import (
	"math/bits"
	"time"
)

// Bucket layout, in nanoseconds: durations under 2^subBits ns each have a
// bucket of their own; above, every power of two [2^e, 2^(e+1)) is split
// into 2^subBits equal buckets, 2^(e-subBits) ns wide. A bucket is thus at
// most 1/128 of its lower edge wide. Every power-of-two number of
// microseconds (1000 = 2^3 * 125 ns) falls on a bucket edge.
const (
	subBits = 7
	sub     = 1 << subBits
	maxExp  = 37 // the top power of two: 2^37 ns, about 137 s
)

// Buckets is the number of buckets; the last one also holds everything
// from 2^38 ns (about 275 s) on.
const Buckets = (maxExp - subBits + 2) * sub

// Histogram counts durations. The zero value is empty and ready.
type Histogram struct {
	Counts [Buckets]uint64 // by bucket: see Upper
	N      uint64
	Sum    time.Duration
	Max    time.Duration
}

// Bucket returns the index of the bucket d falls in; negative durations
// count as 0.
func Bucket(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < sub {
		return int(v)
	}
	e := bits.Len64(v) - 1
	if e > maxExp {
		return Buckets - 1
	}
	shift := e - subBits
	return (shift+1)*sub + int(v>>shift) - sub
}

// Lower returns the shortest duration bucket i holds.
func Lower(i int) time.Duration {
	if i < sub {
		return time.Duration(i)
	}
	shift := i/sub - 1
	return time.Duration(uint64(sub+i%sub) << shift)
}

// Upper returns the duration just past bucket i: bucket i holds
// [Lower(i), Upper(i)), except that the last one holds everything longer.
func Upper(i int) time.Duration { return Lower(i + 1) }

// Add records one duration.
func (h *Histogram) Add(d time.Duration) {
	h.Counts[Bucket(d)]++
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

// Quantile returns the q-quantile (0 < q <= 1) to within 1 %: the longest
// duration of the bucket it falls in, at most the largest sample, so never
// under the exact value and at most 1/128 of it over.
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
			if i == Buckets-1 {
				return h.Max
			}
			return min(Upper(i)-1, h.Max)
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
