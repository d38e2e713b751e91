package examples_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the demos started must be gone when the tests end; the
// example programs built for the tests are removed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if programs.dir != "" {
			os.RemoveAll(programs.dir)
		}
		os.Exit(code)
	}))
}
