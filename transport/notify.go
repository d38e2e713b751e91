package transport

import (
	"bytes"
	"fmt"

	"github.com/ecxfer/ecxfer/xfer"
)

// Notify gives a grant back to a registered producer, with no READ.
func (d *TCPData) Notify(agent string, notif []byte) error {
	if len(notif) > maxNotifLen {
		return fmt.Errorf("transport: notification longer than %d bytes", maxNotifLen)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return xfer.ErrClosed
	}
	p := d.peers[agent]
	d.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	p.sendNotes([][]byte{bytes.Clone(notif)})
	return nil
}
