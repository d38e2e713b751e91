package xfertest_test

import (
	"testing"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

// newMyPair makes what the suite needs: a consumer and a producer of your
// data plane, over regions it can read and write. Here the plane is this
// module's TCP data plane; for yours, construct yours. The suite closes
// both planes; the regions close with the test.
func newMyPair(t *testing.T) xfertest.Pair {
	region := func() *cache.Region {
		r, err := cache.NewRegion(cache.RegionConfig{Blocks: 64, BlockSize: 256})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	cr, pr := region(), region()
	serveAll := func(string, []byte, []int) (func(), bool) { return func() {}, true }
	prod, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Authorize: serveAll}, pr)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := transport.NewTCPData(transport.TCPConfig{}, cr)
	if err != nil {
		t.Fatal(err)
	}
	return xfertest.Pair{Consumer: cons, Producer: prod, ConsumerBlock: cr.Block, ProducerBlock: pr.Block, Blocks: 64}
}

// A data plane of your own keeps the contract the sessions rely on when it
// passes the conformance suite: in your package's tests,
//
//	func TestConformance(t *testing.T) { xfertest.Conformance(t, newMyPair) }
//
// with newMyPair as above. (This package runs exactly that.)
func Example_conformance() {
	_ = newMyPair
}
