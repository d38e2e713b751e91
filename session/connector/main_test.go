package connector_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test started (Serve, the control and data planes) must
// be gone when the tests end.
func TestMain(m *testing.M) {
	if spec := os.Getenv("ECXFER_BENCH_PRODUCER"); spec != "" {
		os.Exit(benchProducerMain(spec)) // a producer process (benchmarks, process faults)
	}
	if spec := os.Getenv("ECXFER_ENGINE_PRODUCER"); spec != "" {
		os.Exit(engineProducerMain(spec)) // BenchmarkEngine's producer process
	}
	if ep := os.Getenv("ECXFER_FAULT_CONSUMER"); ep != "" {
		os.Exit(consumerMain(ep)) // TestProcessFaults's consumer process
	}
	goleak.VerifyTestMain(m)
}

// must returns v, panicking on err: for constructors in tests.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
