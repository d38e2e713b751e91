package xfertest

import (
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

func init() {
	plane.Register(func(data any) any {
		if f, ok := data.(*Fake); ok {
			return f.f
		}
		return nil
	})
}

// Fabric connects fake data planes: each is reachable by its agent name.
type Fabric struct{ f *xfake.Fabric }

// NewFabric returns an empty fabric.
func NewFabric() *Fabric { return &Fabric{xfake.NewFabric()} }

// New returns a fake data plane named name with a region of blocks blocks
// of blockSize bytes (in memory), reachable from the fabric's other fakes.
func (fab *Fabric) New(name string, blocks, blockSize int) *Fake {
	return &Fake{fab.f.New(name, blocks, blockSize)}
}

// Fake is an in-memory xfer.DataTransport for an engine's deterministic
// tests: a READ posted on one fake of a Fabric completes at its first
// Check, with the producer's bytes in the consumer's blocks, and its
// notification reaches the producer's DrainNotifs exactly once. It keeps
// the contract Conformance checks, and offers the sessions its agent name
// and taking producers' shapes, as NIXL does. Its zero value is not
// usable; see Fabric.New.
type Fake struct{ f *xfake.Fake }

var _ xfer.DataTransport = (*Fake)(nil)

// Block returns block i of the fake's region, for filling and verifying.
func (f *Fake) Block(i int) []byte { return f.f.Block(i) }

// AgentMetadata implements xfer.DataTransport.
func (f *Fake) AgentMetadata() []byte { return f.f.AgentMetadata() }

// MemDescriptor implements xfer.DataTransport.
func (f *Fake) MemDescriptor() []byte { return f.f.MemDescriptor() }

// AddRemotePeer implements xfer.DataTransport: the metadata names a fake
// on the same fabric; the descriptor is not read.
func (f *Fake) AddRemotePeer(metadata, memDescriptor []byte) (xfer.Peer, error) {
	return f.f.AddRemotePeer(metadata, memDescriptor)
}

// RemoveRemotePeer implements xfer.DataTransport.
func (f *Fake) RemoveRemotePeer(agent string) error { return f.f.RemoveRemotePeer(agent) }

// PostRead implements xfer.DataTransport.
func (f *Fake) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	return f.f.PostRead(local, agent, remote, notif)
}

// Check implements xfer.DataTransport.
func (f *Fake) Check(h xfer.Handle) (xfer.Progress, error) { return f.f.Check(h) }

// Release implements xfer.DataTransport.
func (f *Fake) Release(h xfer.Handle) error { return f.f.Release(h) }

// DrainNotifs implements xfer.DataTransport.
func (f *Fake) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) { return f.f.DrainNotifs(dst) }

// Close implements xfer.DataTransport: READs from other fakes of this one
// fail from now on, as after a crash.
func (f *Fake) Close() error { return f.f.Close() }
