//go:build !nixl && !nixlfake

package nixl

import (
	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/xfer"
)

// This file is the build without NIXL (no nixl or nixlfake tag), which
// godoc shows. Its comments say what the NIXL build does; here New returns
// ErrNotBuilt, so no Agent exists, and a nil *Agent's methods return
// ErrNotBuilt (or nothing).

// Agent is a NIXL agent over the region (registered as DRAM), safe for
// concurrent use. A build without NIXL cannot make one.
type Agent struct{ _ [0]func() }

var _ xfer.DataTransport = (*Agent)(nil)

// New creates agent cfg.Name over region, which must stay mapped until
// Close returns. Errors: xfer.ErrBadConfig, NIXL's (wrapped), ErrNotBuilt.
func New(Config, *cache.Region) (*Agent, error) { return nil, ErrNotBuilt }

// AgentMetadata returns NIXL's metadata of this agent.
func (*Agent) AgentMetadata() []byte { return nil }

// MemDescriptor returns the region's descriptor list, one per block.
func (*Agent) MemDescriptor() []byte { return nil }

// AddRemotePeer loads a producer (its mem descriptor must not be empty);
// READs posted before the load ends wait for it.
func (*Agent) AddRemotePeer(_, _ []byte) (xfer.Peer, error) { return xfer.Peer{}, ErrNotBuilt }

// RemoveRemotePeer implements xfer.DataTransport.
func (*Agent) RemoveRemotePeer(string) error { return ErrNotBuilt }

// PostRead implements xfer.DataTransport; a READ NIXL refuses once posted
// ends Failed, and one to a peer whose load failed gets xfer.ErrUnknownPeer.
func (*Agent) PostRead([]int, string, []int, []byte) (xfer.Handle, error) { return 0, ErrNotBuilt }

// Check implements xfer.DataTransport: a READ NIXL failed is xfer.Failed.
func (*Agent) Check(xfer.Handle) (xfer.Progress, error) { return 0, ErrNotBuilt }

// Release implements xfer.DataTransport; a running READ is kept until it ends.
func (*Agent) Release(xfer.Handle) error { return ErrNotBuilt }

// DrainNotifs implements xfer.DataTransport; past 65,536 waiting, it drops.
func (*Agent) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) { return dst, ErrNotBuilt }

// Notify gives a grant back to a registered producer, with no READ.
func (*Agent) Notify(string, []byte) error { return ErrNotBuilt }

// Close lets READs in flight end for up to Config.CloseTimeout, then
// destroys the agent: nothing writes into the region after it returns.
func (*Agent) Close() error { return nil }
