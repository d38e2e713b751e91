//go:build !nixl && !nixlfake

package nixl

import (
	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/xfer"
)

// This file is the build without NIXL (no nixl or nixlfake tag), which
// godoc shows. Each comment says first what the NIXL build does, then what
// this one does: New returns ErrNotBuilt, so no Agent exists here, and the
// methods of a nil *Agent return ErrNotBuilt (or nothing).

// Agent is a NIXL agent, an xfer.DataTransport with the region registered
// as DRAM, one descriptor per block. It is safe for concurrent use; its
// methods never wait on the network, nor, unless Config.SyncPost, for a
// call into C. In this build an Agent cannot be made.
type Agent struct{ _ [0]func() }

var _ xfer.DataTransport = (*Agent)(nil)

// New creates a NIXL agent named cfg.Name over region and starts what
// drives it; the region must stay mapped until Close returns. A missing
// name or region, or an unknown Progress, is xfer.ErrBadConfig; NIXL's
// errors are wrapped. In this build New returns ErrNotBuilt.
func New(Config, *cache.Region) (*Agent, error) { return nil, ErrNotBuilt }

// AgentMetadata implements xfer.DataTransport: NIXL's metadata of this
// agent. In this build: nil.
func (*Agent) AgentMetadata() []byte { return nil }

// MemDescriptor implements xfer.DataTransport: the region's per-block
// descriptor list. In this build: nil.
func (*Agent) MemDescriptor() []byte { return nil }

// AddRemotePeer implements xfer.DataTransport; the mem descriptor must not
// be empty. Unless Config.SyncPost the progress goroutine loads the peer,
// and READs posted meanwhile wait for it. In this build: ErrNotBuilt.
func (*Agent) AddRemotePeer(_, _ []byte) (xfer.Peer, error) { return xfer.Peer{}, ErrNotBuilt }

// RemoveRemotePeer implements xfer.DataTransport (unless Config.SyncPost,
// on the progress goroutine). In this build: ErrNotBuilt.
func (*Agent) RemoveRemotePeer(string) error { return ErrNotBuilt }

// PostRead implements xfer.DataTransport; every id must name a block of
// its region. Unless Config.SyncPost a READ NIXL refuses later ends
// Failed, and after a peer's load failed its READs are refused with
// xfer.ErrUnknownPeer. In this build: ErrNotBuilt.
func (*Agent) PostRead([]int, string, []int, []byte) (xfer.Handle, error) { return 0, ErrNotBuilt }

// Check implements xfer.DataTransport: a READ NIXL failed is xfer.Failed,
// a request NIXL does not know an error. In this build: ErrNotBuilt.
func (*Agent) Check(xfer.Handle) (xfer.Progress, error) { return 0, ErrNotBuilt }

// Release implements xfer.DataTransport; a READ still in progress is
// kept until it ends (xfer.ErrMayStillWrite). In this build: ErrNotBuilt.
func (*Agent) Release(xfer.Handle) error { return ErrNotBuilt }

// DrainNotifs implements xfer.DataTransport; past 65,536 waiting,
// notifications are dropped. In this build: dst and ErrNotBuilt.
func (*Agent) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) { return dst, ErrNotBuilt }

// Notify sends a registered producer a notification with no READ, giving
// back a grant; it does not block. In this build: ErrNotBuilt.
func (*Agent) Notify(string, []byte) error { return ErrNotBuilt }

// Close implements xfer.DataTransport: it lets READs in flight end for up
// to Config.CloseTimeout, then destroys the agent; nothing writes into the
// region after it returns, and READs it stopped are reported wrapping
// xfer.ErrMayStillWrite. In this build: nil.
func (*Agent) Close() error { return nil }
