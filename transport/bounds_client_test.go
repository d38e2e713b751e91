package transport

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// identityOf sends a request from c to s and returns the identity s sees.
func identityOf(t *testing.T, c *Client, s *Server) []byte {
	t.Helper()
	if err := c.Send(s.Endpoint(), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	var id []byte
	until(t, "the request at "+s.Endpoint(), func() bool {
		for _, m := range s.Drain(nil) {
			id = m.Identity
		}
		return id != nil
	})
	return id
}

// waiting returns what of the producer at addr's replies waits for Drain.
func waiting(c *Client, addr string) (n, bytes int64) {
	c.mu.Lock()
	d := c.peers[addr]
	c.mu.Unlock()
	if d == nil {
		return 0, 0
	}
	return d.queued.Load(), d.queuedBytes.Load()
}

// The rule: a producer's replies waiting for Drain take at most MaxFrame
// bytes of the consumer's memory; past that its connection is not read
// until a Drain makes room, so a producer that answers faster than the
// consumer drains holds no more, and loses nothing: every reply comes, in
// order. A neighbour's replies are not held up behind it.
func TestClientRepliesWaitingBounded(t *testing.T) {
	const frame, reply, replies = 1 << 20, 200 << 10, 64
	flood := newServer(t, ServerConfig{WriteTimeout: time.Minute, MaxQueued: 4 * replies})
	honest := newServer(t, ServerConfig{})
	c := newClient(t, ClientConfig{MaxFrame: frame})
	fid, hid := identityOf(t, c, flood), identityOf(t, c, honest)

	for i := range replies {
		p := make([]byte, reply)
		for j := range p {
			p[j] = byte(i + j)
		}
		binary.LittleEndian.PutUint32(p, uint32(i))
		if err := flood.Reply(fid, p); err != nil {
			t.Fatal(err)
		}
	}
	// Until the connection waits for a Drain, or every reply has come.
	until(t, "the flood to stop or stall", func() bool {
		n, _ := waiting(c, flood.Endpoint())
		return c.stats.throttled.Load() > 0 || n == replies
	})
	check := func() {
		t.Helper()
		if n, b := waiting(c, flood.Endpoint()); b > frame || n > frame/reply {
			t.Fatalf("%d replies of %d bytes wait for Drain: over MaxFrame (%d)", n, b, frame)
		}
	}
	check()
	if err := honest.Reply(hid, []byte("honest")); err != nil {
		t.Fatal(err)
	}
	next, heard := 0, false
	until(t, "every reply", func() bool {
		check()
		for _, in := range c.Drain(nil) {
			switch in.Addr {
			case honest.Endpoint():
				heard = true
			case flood.Endpoint():
				i := int(binary.LittleEndian.Uint32(in.Payload))
				if i != next || len(in.Payload) != reply || in.Payload[reply-1] != byte(i+reply-1) {
					t.Fatalf("reply %d (%d bytes) came where %d was due", i, len(in.Payload), next)
				}
				next++
			}
		}
		return heard && next == replies
	})
	if n, b := waiting(c, flood.Endpoint()); n != 0 || b != 0 {
		t.Fatalf("all drained, yet %d replies (%d bytes) counted as waiting", n, b)
	}
}

// A producer whose replies wait, undrained, past the peer timeout is
// declared silent, whether they are large or many and empty; a neighbour
// with a reply waiting beside them is not, and its reply comes.
func TestClientUndrainedFloodIsSilent(t *testing.T) {
	const frame, timeout = 64 << 10, 300 * time.Millisecond
	for _, tc := range []struct {
		name      string
		n, length int
	}{{"large", 8, frame / 2}, {"empty", maxWaiting + 100, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			flood := newServer(t, ServerConfig{WriteTimeout: time.Minute, MaxQueued: 2 * tc.n, PingInterval: 50 * time.Millisecond})
			honest := newServer(t, ServerConfig{PingInterval: 50 * time.Millisecond})
			c := newClient(t, ClientConfig{MaxFrame: frame, PingInterval: 50 * time.Millisecond, PeerTimeout: timeout})
			fid, hid := identityOf(t, c, flood), identityOf(t, c, honest)
			for range tc.n {
				if err := flood.Reply(fid, make([]byte, tc.length)); err != nil {
					t.Fatal(err)
				}
			}
			if err := honest.Reply(hid, []byte("honest")); err != nil {
				t.Fatal(err)
			}
			var deaths []xfer.Death
			until(t, "a death", func() bool { deaths = c.Dead(deaths); return len(deaths) > 0 })
			// The neighbour's heartbeats go on being read: three more
			// peer timeouts pass without its death.
			for end := time.Now().Add(3 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				deaths = c.Dead(deaths)
			}
			if d := deaths[0]; len(deaths) != 1 || d.Addr != flood.Endpoint() || !errors.Is(d.Err, xfer.ErrPeerSilent) {
				t.Fatalf("deaths %v: want the flood's alone, silent", deaths)
			}
			var got []string
			for _, in := range c.Drain(nil) {
				if in.Addr == honest.Endpoint() {
					got = append(got, string(in.Payload))
				}
			}
			if len(got) != 1 || got[0] != "honest" {
				t.Fatalf("the neighbour's replies: %q", got)
			}
		})
	}
}
