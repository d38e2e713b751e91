package examples_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the demos started must be gone when the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
