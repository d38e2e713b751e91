package transport

import "sync"

// replyBudget bounds the reply bytes a Server holds for consumers that
// have not taken them: per connection (a reply past perConn is refused,
// unless none of that connection's waits) and for all connections
// together (past max, the connection holding the most is closed: the
// consumer that does not read pays, not its neighbours). It owns the
// count: a connection's bytes count from the moment they are queued until
// the socket takes them or the connection closes.
type replyBudget struct {
	perConn, max int

	mu    sync.Mutex
	total int
	held  map[*guardConn]int // registered connections and their bytes
}

func newReplyBudget(perConn, max int) *replyBudget {
	return &replyBudget{perConn: perConn, max: max, held: map[*guardConn]int{}}
}

// register starts counting g's replies.
func (b *replyBudget) register(g *guardConn) {
	b.mu.Lock()
	if _, ok := b.held[g]; !ok {
		b.held[g] = 0
	}
	b.mu.Unlock()
}

// drop stops counting g's replies and gives its bytes back.
func (b *replyBudget) drop(g *guardConn) {
	b.mu.Lock()
	b.total -= b.held[g]
	delete(b.held, g)
	b.mu.Unlock()
}

// queue counts n more bytes for g. Unless must (bytes already partly on
// the wire), it refuses when g has replies waiting and n would take it
// past perConn; it refuses a g not registered (closed). Past max, it
// takes the connections holding the most out of the count until the
// total fits, and returns them for the caller to close (outside its
// locks); g may be one of them.
func (b *replyBudget) queue(g *guardConn, n int, must bool) (ok bool, cut []*guardConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	own, reg := b.held[g]
	if !reg {
		return false, nil
	}
	if !must && own > 0 && own+n > b.perConn {
		return false, nil
	}
	b.held[g] = own + n
	b.total += n
	for b.total > b.max {
		var top *guardConn
		most := -1
		for c, h := range b.held {
			if h > most {
				top, most = c, h
			}
		}
		b.total -= most
		delete(b.held, top)
		cut = append(cut, top)
	}
	return true, cut
}

// written gives back n bytes of g's that the socket took.
func (b *replyBudget) written(g *guardConn, n int) {
	b.mu.Lock()
	if h, ok := b.held[g]; ok {
		b.held[g] = h - n
		b.total -= n
	}
	b.mu.Unlock()
}

// bytes returns the bytes counted, in all and for g, for tests.
func (b *replyBudget) bytes(g *guardConn) (total, own int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, b.held[g]
}
