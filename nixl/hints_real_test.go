//go:build nixl

package nixl

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/wire"
)

// UCX_TLS=sm without ucx_error_handling_mode=none: NIXL fails the
// backend's creation, and the error names the parameter.
func TestSharedMemoryWithoutErrorModeRealNIXL(t *testing.T) {
	t.Setenv("UCX_TLS", "sm")
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 4096, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a, err := New(Config{Name: "sm-peer-mode"}, r)
	if err == nil {
		a.Close()
		t.Fatal("NIXL 1.4.0 over UCX 1.22 made a UCX_TLS=sm backend in the peer error mode")
	}
	needNIXL(t, err)
	if !strings.Contains(err.Error(), "UCX_TLS=sm needs the backend parameter ucx_error_handling_mode=none") {
		t.Fatalf("New: %v", err)
	}
}

// A producer whose agent is gone: loading its metadata over TCP fails, and
// the error names the peer and UCX_TLS.
func TestUnreachablePeerRealNIXL(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	p, pr := newAgentNoCleanup(t, Config{Name: "gone-producer"})
	md, desc := p.AgentMetadata(), p.MemDescriptor()
	p.Close()
	pr.Close()
	c, _ := newAgent(t, variants[0], 4, 4096, Config{SyncPost: true})
	_, err := c.AddRemotePeer(md, desc)
	if err == nil {
		t.Skip("NIXL loaded a closed agent's metadata (it connects only at the first READ here)")
	}
	want := `could not reach the peer agent "gone-producer" at the transport address its metadata names (UCX_TLS=tcp)`
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("load: %v\nwant it to say %q", err, want)
	}
	if got := peerAgentName(md); got != strconv.Quote("gone-producer") {
		t.Errorf("peerAgentName of NIXL's metadata: %s", got)
	}
}

// A shape naming memory the producer never registered: NIXL cannot make
// the READ, and the error says why.
func TestNotRegisteredRealNIXL(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		p, _ := newAgent(t, v, 4, 4096, Config{})
		own, _, err := wire.DecodeBlocks(p.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		c, _ := newAgent(t, v, 4, 4096, Config{SyncPost: true})
		peer, err := c.addRemotePeerShape(p.AgentMetadata(), wire.Blocks{Base: own.Base + 1<<30, Size: own.Size, Count: 4})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.PostRead([]int{0}, peer.Agent, []int{0}, nil)
		if !errors.Is(err, errNotMade) {
			t.Fatalf("READ of unregistered memory: %v, want errNotMade", err)
		}
	})
}

// newAgentNoCleanup is newAgent for an agent the test closes itself.
func newAgentNoCleanup(t *testing.T, cfg Config) (*Agent, *cache.Region) {
	t.Helper()
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 4096, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, r)
	if err != nil {
		r.Close()
		needNIXL(t, err)
		t.Fatal(err)
	}
	return a, r
}
