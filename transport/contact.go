package transport

import (
	"context"
	"fmt"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/xfer"
)

func init() {
	plane.RegisterContacter(func(data any) plane.Contacter {
		if d, ok := data.(*TCPData); ok {
			return tcpContact{d}
		}
		return nil
	})
}

// tcpContact is a TCPData's plane.Contacter.
type tcpContact struct{ d *TCPData }

// Contact implements plane.Contacter: every connection to the producer is
// brought up and has its welcome, so that the first READ pays for no
// connection, and a producer whose region this plane mapped has proven it
// is its own (before the proof, READs go over the socket) and had the
// mapping's pages faulted in.
func (c tcpContact) Contact(ctx context.Context, agent string) error {
	d := c.d
	d.mu.Lock()
	p := d.peers[agent]
	d.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	for _, l := range p.links {
		if err := l.contact(ctx); err != nil {
			return fmt.Errorf("transport: contact with %s: %w", p.name, err)
		}
	}
	if p.sh == nil {
		return nil
	}
	select {
	case <-p.sh.populated:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
