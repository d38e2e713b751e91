// Package metrics exports a Pool's and a Producer's counters to Prometheus,
// safely while the engine steps; docs/operations.md lists the metrics.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ecxfer/ecxfer/internal/hist"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/wire"
)

type desc struct {
	d    *prometheus.Desc
	kind prometheus.ValueType
}

func newDesc(name, help string, kind prometheus.ValueType, labels []string, constLabels prometheus.Labels) desc {
	return desc{prometheus.NewDesc(name, help, labels, constLabels), kind}
}

// poolCollector collects a consumer Pool's metrics, ecxfer_consumer_*.
type poolCollector struct {
	pool                                               *connector.Pool
	fetches, failures, latency, bytes, retries, nacks  desc
	ackTimeouts, quarantines, released, forced, deaths desc
	malformed, inflight, sessions, reaped, joined      desc
}

// NewPoolCollector returns a collector for pool; constLabels may be nil.
func NewPoolCollector(pool *connector.Pool, constLabels prometheus.Labels) prometheus.Collector {
	c, g := prometheus.CounterValue, prometheus.GaugeValue
	return &poolCollector{
		pool:        pool,
		fetches:     newDesc("ecxfer_consumer_fetches_total", "Fetches ended, by result (completed, failed), and joined.", c, []string{"result"}, constLabels),
		failures:    newDesc("ecxfer_consumer_failures_total", "Failed fetches by reason.", c, []string{"reason"}, constLabels),
		latency:     newDesc("ecxfer_consumer_fetch_latency_seconds", "From Fetch to completion.", c, nil, constLabels),
		bytes:       newDesc("ecxfer_consumer_bytes_total", "Bytes of completed fetches.", c, nil, constLabels),
		retries:     newDesc("ecxfer_consumer_retries_total", "Attempts retried.", c, nil, constLabels),
		nacks:       newDesc("ecxfer_consumer_nacks_total", "NACKs received, by status.", c, []string{"status"}, constLabels),
		ackTimeouts: newDesc("ecxfer_consumer_ack_timeouts_total", "Attempts without an ack in time.", c, nil, constLabels),
		quarantines: newDesc("ecxfer_consumer_quarantines_total", "READs quarantined (blocks held while they may still write).", c, nil, constLabels),
		released:    newDesc("ecxfer_consumer_released_total", "Held blocks given back.", c, nil, constLabels),
		forced:      newDesc("ecxfer_consumer_forced_evictions_total", "Held blocks given back at the quarantine deadline, their READ not confirmed ended.", c, nil, constLabels),
		deaths:      newDesc("ecxfer_consumer_peer_deaths_total", "Producers declared dead.", c, nil, constLabels),
		malformed:   newDesc("ecxfer_consumer_malformed_total", "Acks that did not decode.", c, nil, constLabels),
		inflight:    newDesc("ecxfer_consumer_fetches_in_flight", "Fetches not ended.", g, nil, constLabels),
		sessions:    newDesc("ecxfer_consumer_sessions", "Producer sessions held.", g, nil, constLabels),
		reaped:      newDesc("ecxfer_consumer_sessions_reaped_total", "Idle producer sessions closed.", c, nil, constLabels),
		joined:      newDesc("ecxfer_consumer_fetches_joined_total", "Fetches joined to one in flight.", c, nil, constLabels),
	}
}

func (pc *poolCollector) descs() []desc {
	return []desc{pc.fetches, pc.failures, pc.latency, pc.bytes, pc.retries, pc.nacks, pc.ackTimeouts, pc.quarantines,
		pc.released, pc.forced, pc.deaths, pc.malformed, pc.inflight, pc.sessions, pc.reaped, pc.joined}
}

// Describe implements prometheus.Collector.
func (pc *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range pc.descs() {
		ch <- d.d
	}
}

// Collect implements prometheus.Collector.
func (pc *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := pc.pool.Stats()
	m := func(d desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.d, d.kind, v, labels...)
	}
	m(pc.fetches, float64(s.Completed), "completed")
	m(pc.fetches, float64(s.Failed), "failed")
	for r, n := range s.FailedBy {
		m(pc.failures, float64(n), r.String())
	}
	ch <- histogram(pc.latency.d, s.Latency)
	m(pc.bytes, float64(s.BytesMoved))
	m(pc.retries, float64(s.Retries))
	nacks(ch, pc.nacks.d, s.Nacks)
	m(pc.ackTimeouts, float64(s.AckTimeouts))
	m(pc.quarantines, float64(s.Quarantines))
	m(pc.released, float64(s.Released))
	m(pc.forced, float64(s.ForcedEvictions))
	m(pc.deaths, float64(s.PeerDeaths))
	m(pc.malformed, float64(s.Malformed))
	m(pc.inflight, float64(s.InFlight))
	m(pc.sessions, float64(s.Sessions))
	m(pc.reaped, float64(s.Reaped))
	m(pc.joined, float64(s.Joined))
}

// producerCollector collects a Producer's metrics, ecxfer_producer_*.
type producerCollector struct {
	prod                                                           *connector.Producer
	requests, grants, nacks, completions, expired, rerequests      desc
	malformed, unknown, foreign, bad, stale, refused               desc
	replyErrors, descs_, descBytes, shapes, live, backlog, dropped desc
}

// NewProducerCollector returns a collector for prod; constLabels may be nil.
func NewProducerCollector(prod *connector.Producer, constLabels prometheus.Labels) prometheus.Collector {
	c, g := prometheus.CounterValue, prometheus.GaugeValue
	return &producerCollector{
		prod:        prod,
		requests:    newDesc("ecxfer_producer_requests_total", "Requests decoded.", c, nil, constLabels),
		grants:      newDesc("ecxfer_producer_grants_total", "Grants made (OK acks).", c, nil, constLabels),
		nacks:       newDesc("ecxfer_producer_nacks_total", "NACKs sent, by status.", c, []string{"status"}, constLabels),
		completions: newDesc("ecxfer_producer_completions_total", "Grants ended by their READ's notification.", c, nil, constLabels),
		expired:     newDesc("ecxfer_producer_lease_expiries_total", "Grants ended by their pin lease.", c, nil, constLabels),
		rerequests:  newDesc("ecxfer_producer_rerequests_total", "Grants made while the session held one for the entry.", c, nil, constLabels),
		malformed:   newDesc("ecxfer_producer_malformed_total", "Requests that did not decode.", c, nil, constLabels),
		unknown:     newDesc("ecxfer_producer_unknown_notifications_total", "Notifications matching no grant.", c, nil, constLabels),
		foreign:     newDesc("ecxfer_producer_foreign_notifications_total", "Notifications from an agent the grant is not bound to.", c, nil, constLabels),
		bad:         newDesc("ecxfer_producer_bad_notifications_total", "Notifications that are not UTF-8.", c, nil, constLabels),
		stale:       newDesc("ecxfer_producer_stale_requests_total", "Requests refused NACK_NOT_READY for waiting past MaxRequestAge.", c, nil, constLabels),
		refused:     newDesc("ecxfer_producer_refused_total", "Requests refused by a bound, by bound (grants, pinned).", c, []string{"bound"}, constLabels),
		replyErrors: newDesc("ecxfer_producer_reply_errors_total", "Replies the control plane refused.", c, nil, constLabels),
		descs_:      newDesc("ecxfer_producer_descriptors_sent_total", "OK acks that carried the mem descriptor.", c, nil, constLabels),
		descBytes:   newDesc("ecxfer_producer_descriptor_bytes_sent_total", "Bytes of mem descriptors sent.", c, nil, constLabels),
		shapes:      newDesc("ecxfer_producer_shapes_sent_total", "OK acks that carried the region's shape for the mem descriptor.", c, nil, constLabels),
		live:        newDesc("ecxfer_producer_grants", "Grants holding a pin now.", g, nil, constLabels),
		backlog:     newDesc("ecxfer_producer_backlog", "Requests waiting for a later step.", g, nil, constLabels),
		dropped:     newDesc("ecxfer_producer_backlog_dropped_total", "Requests dropped because the backlog was full.", c, nil, constLabels),
	}
}

func (pc *producerCollector) descs() []desc {
	return []desc{pc.requests, pc.grants, pc.nacks, pc.completions, pc.expired, pc.rerequests, pc.malformed, pc.unknown,
		pc.foreign, pc.bad, pc.stale, pc.refused, pc.replyErrors, pc.descs_, pc.descBytes, pc.shapes, pc.live, pc.backlog, pc.dropped}
}

// Describe implements prometheus.Collector.
func (pc *producerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range pc.descs() {
		ch <- d.d
	}
}

// Collect implements prometheus.Collector.
func (pc *producerCollector) Collect(ch chan<- prometheus.Metric) {
	s := pc.prod.Stats()
	waiting, dropped := pc.prod.Backlog()
	m := func(d desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.d, d.kind, float64(v), labels...)
	}
	m(pc.requests, s.Requests)
	m(pc.grants, s.Grants)
	nacks(ch, pc.nacks.d, s.Nacks)
	m(pc.completions, s.Completions)
	m(pc.expired, s.Expired)
	m(pc.rerequests, s.ReRequests)
	m(pc.malformed, s.Malformed)
	m(pc.unknown, s.UnknownNotifs)
	m(pc.foreign, s.ForeignNotifs)
	m(pc.bad, s.BadNotifs)
	m(pc.stale, s.Stale)
	m(pc.refused, s.OverBound, "grants")
	m(pc.refused, s.OverPinned, "pinned")
	m(pc.replyErrors, s.ReplyErrors)
	m(pc.descs_, s.DescsSent)
	m(pc.descBytes, s.DescBytes)
	m(pc.shapes, s.ShapesSent)
	m(pc.live, uint64(pc.prod.Grants()))
	m(pc.backlog, uint64(waiting))
	m(pc.dropped, dropped)
}

func nacks(ch chan<- prometheus.Metric, d *prometheus.Desc, n [6]uint64) {
	for st := wire.Status(1); int(st) < len(n); st++ {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(n[st]), st.String())
	}
}

// Exported bucket bounds: 2 µs, 4 µs, ... 2^27 µs (134 s). Each is an edge
// of the histogram's finer buckets, so the counts under it are exact.
const promBuckets = 27

// histogram turns a latency histogram into a Prometheus one in seconds,
// with power-of-two microsecond bounds: the histogram's thousands of fine
// buckets would make as many series.
func histogram(d *prometheus.Desc, h *connector.Histogram) prometheus.Metric {
	buckets := make(map[float64]uint64, promBuckets)
	var cum uint64
	next := 0
	for e := 1; e <= promBuckets; e++ {
		bound := time.Duration(1<<e) * time.Microsecond
		for end := hist.Bucket(bound); next < end; next++ {
			cum += h.Counts[next]
		}
		buckets[bound.Seconds()] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.N, h.Sum.Seconds(), buckets)
}
