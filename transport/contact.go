package transport

import (
	"context"
	"fmt"
	"time"

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
// mapping's pages faulted in. With notif, a READ of no blocks under the
// producer's contact grant goes on the connection pushes come on: it ends
// the grant, and proves that connection to be the consumer session's, so
// that the first fetch's blocks may be pushed with its ack, as later
// ones' are.
func (c tcpContact) Contact(ctx context.Context, agent string, notif []byte) error {
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
	if notif != nil {
		if err := c.readNothing(ctx, agent, notif); err != nil {
			return err
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

// readNothing posts a READ of no blocks under notif's grant and waits for
// its end. One the producer refused (its grant gone) costs only the
// binding: the first fetch then goes without a push.
func (c tcpContact) readNothing(ctx context.Context, agent string, notif []byte) error {
	h, err := c.d.PostRead(nil, agent, nil, notif)
	if err != nil {
		return fmt.Errorf("transport: contact READ: %w", err)
	}
	defer c.d.Release(h)
	t := time.NewTicker(50 * time.Microsecond)
	defer t.Stop()
	for {
		p, err := c.d.Check(h)
		if err != nil || p != xfer.InProgress {
			return err
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
