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

// Agent is a NIXL agent: an xfer.DataTransport over NIXL's agent API,
// with the region registered as DRAM, one descriptor per block. It is
// safe for concurrent use; its methods never wait on the network, and
// unless Config.SyncPost they never wait for a call into C.
//
// In this build an Agent cannot be made.
type Agent struct{ _ [0]func() }

var _ xfer.DataTransport = (*Agent)(nil)

// New creates a NIXL agent named cfg.Name over region: it creates the
// backend (cfg.Backend, UCX by default), registers the region and
// prepares one descriptor per block, and starts what drives the agent
// (cfg.Progress). The region must stay mapped until Close returns. A
// missing name or region, or an unknown Progress, is xfer.ErrBadConfig;
// NIXL's own errors (an unknown backend) are returned wrapped.
//
// In this build New returns ErrNotBuilt.
func New(Config, *cache.Region) (*Agent, error) { return nil, ErrNotBuilt }

// AgentMetadata implements xfer.DataTransport: NIXL's metadata of this
// agent, which consumers load. In this build: nil.
func (*Agent) AgentMetadata() []byte { return nil }

// MemDescriptor implements xfer.DataTransport: the region's per-block
// descriptor list (wire.AppendBlockDescs). In this build: nil.
func (*Agent) MemDescriptor() []byte { return nil }

// AddRemotePeer implements xfer.DataTransport: it loads the remote agent
// and its blocks from the mem descriptor, which must not be empty. A
// descriptor of back-to-back blocks of one size is kept as its shape; any
// other as a list, which NIXL prepares. Unless Config.SyncPost the load
// runs on the progress goroutine and READs posted meanwhile wait for it.
// In this build: ErrNotBuilt.
func (*Agent) AddRemotePeer(_, _ []byte) (xfer.Peer, error) { return xfer.Peer{}, ErrNotBuilt }

// RemoveRemotePeer implements xfer.DataTransport: NIXL forgets the remote
// agent (unless Config.SyncPost on the progress goroutine, after the loads
// and READs queued before). In this build: ErrNotBuilt.
func (*Agent) RemoveRemotePeer(string) error { return ErrNotBuilt }

// PostRead implements xfer.DataTransport: every id must name a block of
// its region (local ones this agent's, remote ones the peer's). Unless
// Config.SyncPost, a READ of more than Config.InlinePost bytes, or one
// posted while C is busy, is queued for the progress goroutine and
// PostRead returns at once. In this build: ErrNotBuilt.
func (*Agent) PostRead([]int, string, []int, []byte) (xfer.Handle, error) { return 0, ErrNotBuilt }

// Check implements xfer.DataTransport: a READ NIXL reports failed is
// xfer.Failed; a request NIXL does not know is an error. Unless
// Config.SyncPost it does not call into NIXL. In this build: ErrNotBuilt.
func (*Agent) Check(xfer.Handle) (xfer.Progress, error) { return 0, ErrNotBuilt }

// Release implements xfer.DataTransport. A READ still in progress is not
// handed to NIXL to abort: the request is kept and released once it ends,
// and Release returns xfer.ErrMayStillWrite. In this build: ErrNotBuilt.
func (*Agent) Release(xfer.Handle) error { return ErrNotBuilt }

// DrainNotifs implements xfer.DataTransport: the completion notifications
// of peers' READs of this agent's region, up to 65,536 waiting (more are
// counted and dropped). In this build: dst and ErrNotBuilt.
func (*Agent) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) { return dst, ErrNotBuilt }

// Notify sends a registered producer a notification with no READ
// (NIXL's genNotif), so that a consumer gives back a grant it will not
// READ; it returns at once, the progress goroutine sending it.
//
// In this build it returns ErrNotBuilt.
func (*Agent) Notify(string, []byte) error { return ErrNotBuilt }

// Close implements xfer.DataTransport: it waits up to Config.CloseTimeout
// for READs in flight to end, driving the agent, then releases every
// request and remote agent, deregisters the region and destroys the
// agent; once it returns nothing writes into the region. READs it had to
// stop that way are reported wrapping xfer.ErrMayStillWrite. In this
// build (no Agent can exist) it returns nil.
func (*Agent) Close() error { return nil }
