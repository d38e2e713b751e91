package xfertest_test

import (
	"testing"

	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

// The conformance example, run.
func TestConformanceExample(t *testing.T) { xfertest.Conformance(t, newMyPair) }
