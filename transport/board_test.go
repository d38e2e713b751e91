package transport

import (
	"testing"

	"github.com/ecxfer/ecxfer/internal/plane"
)

// A session that closes while a successor attaches (the successor made
// current, its board not yet cleared) unpins its grants as soon as its
// Detach returns, without retiring them one by one: by then none of them
// may still be shown on the board, or a same-host consumer's copy would
// take a reused block's bytes for the entry's. The grant sits in the
// board's last slot, the one a clear reaches last.
func TestDetachRacingAttachLeavesNoGrantShown(t *testing.T) {
	p := newTCP(t, newSharedRegion(t, 8, 4096), TCPConfig{Listen: "127.0.0.1:0"})
	n := uint64(len(p.grantTab))
	if n == 0 {
		t.Skip("no grant table: the region is not Shared here")
	}
	for i := range uint64(1000) {
		old := attachGate(p)
		id := (i+1)*n + n - 1 // the last slot
		old.att.Publish(id)
		if p.grantTab[n-1].Load() != id {
			t.Fatal("the current session's grant is not shown")
		}
		attached := make(chan plane.Attachment)
		go func() { attached <- p.attach(&testGate{grants: map[uint64]testGrant{}}) }()
		for p.att.Load() == old.att {
		}
		old.att.Detach() // the session unpins its grants from here on
		shown := p.grantTab[n-1].Load()
		(<-attached).Detach()
		if shown == id {
			t.Fatalf("try %d: a detached session's grant is still shown on the board once its Detach returned", i)
		}
	}
}
