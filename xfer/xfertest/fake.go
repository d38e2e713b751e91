package xfertest

import (
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

func init() {
	plane.Register(func(data any) any {
		if f, ok := data.(*fake); ok {
			return f.f
		}
		return nil
	})
}

// FakePair returns in-memory planes "consumer" and "producer" of blocks blocks
// of blockSize bytes; a READ completes at its first Check; Close is a crash.
func FakePair(blocks, blockSize int) Pair {
	fab := xfake.NewFabric()
	c := &fake{fab.New("consumer", blocks, blockSize)}
	p := &fake{fab.New("producer", blocks, blockSize)}
	return Pair{Consumer: c, Producer: p, ConsumerBlock: c.Block, ProducerBlock: p.Block, Blocks: blocks}
}

// fake is one side of FakePair.
type fake struct{ f *xfake.Fake }

var _ xfer.DataTransport = (*fake)(nil)

// Block returns block i of the fake's region, for filling and verifying.
func (f *fake) Block(i int) []byte { return f.f.Block(i) }

// AgentMetadata implements xfer.DataTransport.
func (f *fake) AgentMetadata() []byte { return f.f.AgentMetadata() }

// MemDescriptor implements xfer.DataTransport.
func (f *fake) MemDescriptor() []byte { return f.f.MemDescriptor() }

// AddRemotePeer implements xfer.DataTransport: the metadata names a fake
// on the same fabric; the descriptor is not read.
func (f *fake) AddRemotePeer(metadata, memDescriptor []byte) (xfer.Peer, error) {
	return f.f.AddRemotePeer(metadata, memDescriptor)
}

// RemoveRemotePeer implements xfer.DataTransport.
func (f *fake) RemoveRemotePeer(agent string) error { return f.f.RemoveRemotePeer(agent) }

// PostRead implements xfer.DataTransport.
func (f *fake) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	return f.f.PostRead(local, agent, remote, notif)
}

// Check implements xfer.DataTransport.
func (f *fake) Check(h xfer.Handle) (xfer.Progress, error) { return f.f.Check(h) }

// Release implements xfer.DataTransport.
func (f *fake) Release(h xfer.Handle) error { return f.f.Release(h) }

// DrainNotifs implements xfer.DataTransport.
func (f *fake) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) { return f.f.DrainNotifs(dst) }

// Close implements xfer.DataTransport: READs from other fakes of this one
// fail from now on, as after a crash.
func (f *fake) Close() error { return f.f.Close() }
