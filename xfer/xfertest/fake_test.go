package xfertest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/xfake"
)

func newFakePair(t *testing.T) (*xfake.Fake, *xfake.Fake, Pair) {
	fab := xfake.NewFabric()
	c, p := fab.New("consumer", 128, 64), fab.New("producer", 128, 64)
	return c, p, Pair{Consumer: c, Producer: p, ConsumerBlock: c.Block, ProducerBlock: p.Block, Blocks: 128}
}

func TestFakeConformance(t *testing.T) {
	Conformance(t, func(t *testing.T) Pair {
		_, _, pair := newFakePair(t)
		return pair
	})
}

// A plane whose READs move only while the producer is driven passes: the
// suite drives it as a producer's step loop would.
func TestConformanceDrivesTheProducer(t *testing.T) {
	Conformance(t, func(t *testing.T) Pair {
		c, _, pair := newFakePair(t)
		c.SetOutcome(xfake.Outcome{TargetDrains: 3, After: 1})
		return pair
	})
}

// The suite fails a plane that never completes a READ. It runs in a child
// process, since the failure is the point.
func TestConformanceFailsAStuckPlane(t *testing.T) {
	if os.Getenv("XFERTEST_STUCK_CHILD") == "1" {
		waitLimit = 200 * time.Millisecond
		Conformance(t, func(t *testing.T) Pair {
			c, _, pair := newFakePair(t)
			c.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
			return pair
		})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceFailsAStuckPlane$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "XFERTEST_STUCK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed a plane that never completes a READ:\n%s", out)
	}
	for _, sub := range []string{"read", "many_in_flight", "remove_peer"} {
		if !strings.Contains(string(out), "--- FAIL: TestConformanceFailsAStuckPlane/"+sub) {
			t.Errorf("subtest %s did not fail:\n%s", sub, out)
		}
	}
	if !strings.Contains(string(out), "still in progress after") {
		t.Errorf("no READ timed out:\n%s", out)
	}
}

// The public fake passes the suite.
func TestPublicFakeConformance(t *testing.T) {
	Conformance(t, func(t *testing.T) Pair { return FakePair(128, 64) })
}

// The public fake offers the sessions its name and taking shapes
// through internal/plane, not its method set.
func TestPublicFakeOffersThePlumbing(t *testing.T) {
	f := FakePair(4, 64).Consumer
	if n, ok := plane.As[plane.Named](f); !ok || n.Name() != "consumer" {
		t.Fatalf("named: %v", ok)
	}
	if _, ok := plane.As[plane.ShapedPeers](f); !ok {
		t.Fatal("no shapes")
	}
}
