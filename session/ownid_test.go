package session

import (
	"bytes"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/xfake"
)

// repeating yields 16 bytes of a, then b's 16 bytes over and over: a
// ConsumerConfig.Rand whose later ids all repeat (the session's id is a's).
type repeating struct {
	a, b []byte
	n    int
}

func (r *repeating) Read(p []byte) (int, error) {
	for i := range p {
		if r.n < 16 {
			p[i] = r.a[r.n]
		} else {
			p[i] = r.b[(r.n-16)%16]
		}
		r.n++
	}
	return len(p), nil
}

// A request's own session id is carried by no other unanswered request,
// whatever the session's source of ids yields: a reply echoing it is
// matched by it alone. A source that keeps repeating is refused.
func TestOwnIDsNeverRepeat(t *testing.T) {
	rnd := &repeating{a: bytes.Repeat([]byte{1}, 16), b: bytes.Repeat([]byte{2}, 16)}
	c := must(NewConsumerSession(ConsumerConfig{Logger: quiet, Rand: rnd}, &queue{}, xfake.NewFabric().New("c", 8, 16), compat))
	c.ownIDs = true
	far := at(time.Hour)
	_, s1, err := c.send("h1", false, far)
	if err != nil || s1 == c.id {
		t.Fatalf("first own id %q (session %q): %v", s1, c.id, err)
	}
	if _, s2, err := c.send("h2", false, far); err == nil {
		t.Fatalf("a second request carries %q, as the first (%q) does", s2, s1)
	}
	if n := c.unanswered(); n != 1 {
		t.Fatalf("%d unanswered after a refused send", n)
	}
}
