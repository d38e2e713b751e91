package connector_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test started (Serve, the control and data planes) must
// be gone when the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
