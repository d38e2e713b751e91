package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ecxfer/ecxfer/internal/hist"
	"github.com/ecxfer/ecxfer/session/connector"
)

type oneHistogram struct {
	d *prometheus.Desc
	h *connector.Histogram
}

func (c oneHistogram) Describe(ch chan<- *prometheus.Desc) { ch <- c.d }
func (c oneHistogram) Collect(ch chan<- prometheus.Metric) { ch <- histogram(c.d, c.h) }

// The exported buckets count the samples under each power-of-two
// microsecond bound exactly, the ones just under a bound included.
func TestHistogramBuckets(t *testing.T) {
	var h connector.Histogram
	samples := []time.Duration{0, 1999 * time.Nanosecond, 2 * time.Microsecond, 3 * time.Microsecond, 1100 * time.Microsecond, 2047 * time.Microsecond, 2048 * time.Microsecond, time.Minute, time.Hour}
	for _, d := range samples {
		(*hist.Histogram)(&h).Add(d)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(oneHistogram{prometheus.NewDesc("latency_seconds", "latency", nil, nil), &h})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ph := mfs[0].GetMetric()[0].GetHistogram()
	if ph.GetSampleCount() != uint64(len(samples)) {
		t.Fatalf("count %d", ph.GetSampleCount())
	}
	bs := ph.GetBucket()
	if len(bs) != promBuckets {
		t.Fatalf("%d buckets", len(bs))
	}
	for i, b := range bs {
		bound := time.Duration(1<<(i+1)) * time.Microsecond
		if b.GetUpperBound() != bound.Seconds() {
			t.Fatalf("bucket %d bound %v, want %v", i, b.GetUpperBound(), bound.Seconds())
		}
		var want uint64
		for _, d := range samples {
			if d < bound {
				want++
			}
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("under %v: %d, want %d", bound, b.GetCumulativeCount(), want)
		}
	}
}
