package metrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/session/connector/metrics"
	"github.com/ecxfer/ecxfer/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func value(t *testing.T, body, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in the scrape:\n%s", series, body)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// A real scrape over HTTP while fetches run: the counters move as the
// fetches do, and agree between the two sides at the end.
func TestScrapeWhileFetching(t *testing.T) {
	const items, bs = 200, 4096
	pr, _ := cache.NewRegion(cache.RegionConfig{Blocks: 2 * items, BlockSize: bs})
	defer pr.Close()
	entries := cache.NewEmbeddingCache(pr.Blocks())
	for i := range items {
		entries.Alloc(fmt.Sprint("img-", i), 2)
		entries.MarkReady(fmt.Sprint("img-", i))
	}
	pdata, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: quiet}, pr)
	if err != nil {
		t.Fatal(err)
	}
	defer pdata.Close()
	srv, err := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	prod, err := connector.NewProducer(connector.ProducerConfig{CompatHash: "c", Logger: quiet, MaxPinnedShare: 1}, srv, pdata, entries)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { prod.Serve(ctx); close(served) }()
	defer func() { cancel(); <-served; prod.Close() }()

	cr, _ := cache.NewRegion(cache.RegionConfig{Blocks: 2 * items, BlockSize: bs})
	defer cr.Close()
	cdata, _ := transport.NewTCPData(transport.TCPConfig{Logger: quiet}, cr)
	defer cdata.Close()
	cli := transport.NewClient(transport.ClientConfig{Logger: quiet})
	defer cli.Close()
	pool, err := connector.NewPool(connector.PoolConfig{CompatHash: "c", BlockSize: bs, Logger: quiet}, cli, cdata)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewPoolCollector(pool, prometheus.Labels{"role": "consumer"}),
		metrics.NewProducerCollector(prod, prometheus.Labels{"role": "producer"}))
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.PanicOnError}))
	defer hs.Close()

	before := scrape(t, hs.URL)
	if v := value(t, before, `ecxfer_consumer_fetches_total{result="completed",role="consumer"}`); v != 0 {
		t.Fatalf("completed before any fetch: %v", v)
	}
	// Two batches: the scrape between them sees exactly the first one, and
	// a scraper on another goroutine reads while the engine steps the
	// second (the race detector checks the handoff).
	run := func(from, to int) {
		now := time.Now()
		for i := from; i < to; i++ {
			if _, err := pool.Fetch(srv.Endpoint(), fmt.Sprint("img-", i), []int{2 * i, 2*i + 1}, now.Add(10*time.Second), now); err != nil {
				t.Fatal(err)
			}
		}
		for pool.InFlight() > 0 {
			if !pool.Wait(ctx) {
				t.Fatal("context ended")
			}
			if r := pool.Step(time.Now()); len(r.Failed) > 0 {
				t.Fatalf("fetch failed: %+v", r.Failed[0])
			}
		}
	}
	completed := regexp.MustCompile(`(?m)^ecxfer_consumer_fetches_total\{result="completed",role="consumer"\} (\S+)$`)
	run(0, items/2)
	mid := scrape(t, hs.URL)
	if m := value(t, mid, `ecxfer_consumer_fetches_total{result="completed",role="consumer"}`); m != items/2 {
		t.Errorf("between the batches completed = %v, want %d", m, items/2)
	}
	stop, seen := make(chan struct{}), make(chan error, 1)
	go func() {
		last := float64(items / 2)
		for {
			select {
			case <-stop:
				seen <- nil
				return
			default:
			}
			resp, err := http.Get(hs.URL)
			if err != nil {
				seen <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			m := completed.FindSubmatch(b)
			if m == nil {
				seen <- fmt.Errorf("no completed counter in %q", b)
				return
			}
			v, _ := strconv.ParseFloat(string(m[1]), 64)
			if v < last || v > items {
				seen <- fmt.Errorf("completed went from %v to %v", last, v)
				return
			}
			last = v
		}
	}()
	run(items/2, items)
	close(stop)
	if err := <-seen; err != nil {
		t.Error(err)
	}
	pool.Step(time.Now())
	for end := time.Now().Add(5 * time.Second); prod.Grants() > 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond) // Serve takes the last notifications
	}
	after := scrape(t, hs.URL)
	for series, want := range map[string]float64{
		`ecxfer_consumer_fetches_total{result="completed",role="consumer"}`:  items,
		`ecxfer_consumer_fetch_latency_seconds_count{role="consumer"}`:       items,
		`ecxfer_consumer_bytes_total{role="consumer"}`:                       items * 2 * bs,
		`ecxfer_consumer_fetches_in_flight{role="consumer"}`:                 0,
		`ecxfer_consumer_nacks_total{role="consumer",status="NACK_MISSING"}`: 0,
		`ecxfer_producer_grants_total{role="producer"}`:                      items,
		`ecxfer_producer_completions_total{role="producer"}`:                 items,
		`ecxfer_producer_requests_total{role="producer"}`:                    items,
		`ecxfer_producer_grants{role="producer"}`:                            0,
		`ecxfer_producer_shapes_sent_total{role="producer"}`:                 0, // the TCP plane's consumer takes no shapes
	} {
		if got := value(t, after, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if value(t, after, `ecxfer_producer_descriptor_bytes_sent_total{role="producer"}`) <= 0 {
		t.Error("no descriptor bytes counted")
	}
}
