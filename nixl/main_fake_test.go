//go:build nixlfake && !nixl

package nixl

import (
	"testing"

	"go.uber.org/goleak"
)

// The agent's progress goroutine must be gone once every test closed its
// agents. (The nixl build's TestMain is in twoproc_test.go.)
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
