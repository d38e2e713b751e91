//go:build !nixl && !nixlfake

package nixl

import (
	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Agent is a NIXL agent; in this build it cannot be made, and its methods
// report ErrNotBuilt.
type Agent struct{ _ [0]func() }

var (
	_ xfer.DataTransport = (*Agent)(nil)
	_ xfer.Driven        = (*Agent)(nil)
	_ xfer.Signaling     = (*Agent)(nil)
	_ xfer.ShapedPeers   = (*Agent)(nil)
)

// New returns ErrNotBuilt: this build has no NIXL.
func New(Config, *cache.Region) (*Agent, error) { return nil, ErrNotBuilt }

// Name returns "".
func (*Agent) Name() string { return "" }

// AgentMetadata returns nil.
func (*Agent) AgentMetadata() []byte { return nil }

// MemDescriptor returns nil.
func (*Agent) MemDescriptor() []byte { return nil }

// Ready returns nil.
func (*Agent) Ready() <-chan struct{} { return nil }

// ExpectReads does nothing.
func (*Agent) ExpectReads(int) {}

// AddRemotePeer returns ErrNotBuilt.
func (*Agent) AddRemotePeer(_, _ []byte) (xfer.Peer, error) { return xfer.Peer{}, ErrNotBuilt }

// AddRemotePeerShape returns ErrNotBuilt.
func (*Agent) AddRemotePeerShape([]byte, wire.Blocks) (xfer.Peer, error) {
	return xfer.Peer{}, ErrNotBuilt
}

// RemoveRemotePeer returns ErrNotBuilt.
func (*Agent) RemoveRemotePeer(string) error { return ErrNotBuilt }

// PostRead returns ErrNotBuilt.
func (*Agent) PostRead([]int, string, []int, []byte) (xfer.Handle, error) { return 0, ErrNotBuilt }

// Check returns ErrNotBuilt.
func (*Agent) Check(xfer.Handle) (xfer.Progress, error) { return 0, ErrNotBuilt }

// Release returns ErrNotBuilt.
func (*Agent) Release(xfer.Handle) error { return ErrNotBuilt }

// DrainNotifs returns ErrNotBuilt.
func (*Agent) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) { return dst, ErrNotBuilt }

// DroppedNotifs returns 0.
func (*Agent) DroppedNotifs() uint64 { return 0 }

// Close returns nil.
func (*Agent) Close() error { return nil }
