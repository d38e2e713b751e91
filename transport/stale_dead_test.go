package transport

import (
	"errors"
	"testing"
)

// A connection dies and its death is queued for Dead; before Dead takes
// it, the Pool drops the address (Remove: an idle session reaped in the
// same step), and a later Send dials a new connection to the address.
// Dead must not then report the new, healthy connection's address dead:
// the Pool would end the session on it (its waiting transfers retried),
// while the connection stays and its replies to that session's requests
// reach the next session of the address, where a vLLM NACK, which names
// neither session nor attempt, answers that session's request.
func TestRemoveForgetsAQueuedDeath(t *testing.T) {
	c := NewClient(ClientConfig{Logger: quiet})
	defer c.Close()
	addr := "tcp://127.0.0.1:1"
	old := &dealer{c: c, addr: addr, stop: make(chan struct{}), up: make(chan struct{})}
	c.mu.Lock()
	c.peers[addr] = old
	c.mu.Unlock()
	old.die(errors.New("connection closed")) // queued for Dead
	c.Remove(addr)                           // the Pool reaps the idle session
	// The next Send dials anew (as dealerFor does).
	cur := &dealer{c: c, addr: addr, stop: make(chan struct{}), up: make(chan struct{})}
	c.mu.Lock()
	c.peers[addr] = cur
	c.mu.Unlock()
	if dead := c.Dead(nil); len(dead) != 0 {
		t.Fatalf("Dead reports %v after the dead connection was removed and a new one made: the live connection's session would be ended", dead)
	}
	c.mu.Lock()
	still := c.peers[addr] == cur
	c.mu.Unlock()
	if !still {
		t.Fatal("the new connection was dropped")
	}
}
