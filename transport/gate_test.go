package transport

import (
	"crypto/subtle"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
)

// testGate stands in for a producer session attached to a data plane: it
// makes grants (an id, a token, the blocks, the consumer session) and
// grants a READ that presents one's token for blocks of it, as the
// session does. Holds are counted, so that a test sees when the plane gave
// them back.
type testGate struct {
	att    plane.Attachment
	mu     sync.Mutex
	grants map[uint64]testGrant
	held   atomic.Int64
	asked  atomic.Int64
	// before, if set, runs in Authorize (a producer slow to answer).
	before func(notif []byte)
}

type testGrant struct {
	token    wire.Token
	blocks   map[int]bool
	consumer uint64
}

// testGrantIDs: grant ids never repeat in a process, as the session's.
var testGrantIDs atomic.Uint64

// attachGate attaches a fresh gate to p.
func attachGate(p *TCPData) *testGate {
	g := &testGate{grants: map[uint64]testGrant{}}
	g.att = p.attach(g)
	return g
}

// grant makes a grant of blocks for consumer session 1, publishes it and
// returns the notification its READs carry.
func (g *testGate) grant(blocks ...int) []byte { return g.grantFor(1, blocks...) }

func (g *testGate) grantFor(consumer uint64, blocks ...int) []byte {
	id := testGrantIDs.Add(1)
	var tok wire.Token
	tok[0], tok[8] = byte(id)|1, byte(id>>8)^0x5a
	set := map[int]bool{}
	for _, b := range blocks {
		set[b] = true
	}
	g.mu.Lock()
	g.grants[id] = testGrant{token: tok, blocks: set, consumer: consumer}
	g.mu.Unlock()
	g.att.Publish(id)
	return wirext.AppendNotifGrant([]byte("00000000-0000-4000-8000-000000000001:h"), id, tok)
}

// end ends the grant notif names: retired from the board first, as the
// session does.
func (g *testGate) end(notif []byte) {
	_, id, _, _ := wirext.SplitNotifGrant(notif)
	g.att.Retire(id)
	g.mu.Lock()
	delete(g.grants, id)
	g.mu.Unlock()
}

func (g *testGate) Authorize(_ string, notif []byte, blocks []int) (plane.Hold, bool) {
	g.asked.Add(1)
	if g.before != nil {
		g.before(notif)
	}
	_, id, tok, ok := wirext.SplitNotifGrant(notif)
	g.mu.Lock()
	gr, live := g.grants[id]
	g.mu.Unlock()
	if !ok || !live || subtle.ConstantTimeCompare(tok[:], gr.token[:]) != 1 {
		return plane.Hold{}, false
	}
	for _, b := range blocks {
		if !gr.blocks[b] {
			return plane.Hold{}, false
		}
	}
	g.held.Add(1)
	var once sync.Once
	return plane.Hold{Release: func() { once.Do(func() { g.held.Add(-1) }) }, Consumer: gr.consumer}, true
}

// gatedProducer is a producer data plane over region with a gate
// attached.
func gatedProducer(t testing.TB, region *cache.Region, cfg TCPConfig) (*TCPData, *testGate) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	p := newTCP(t, region, cfg)
	return p, attachGate(p)
}
