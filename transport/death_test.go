package transport

import (
	"errors"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// A death says why: a producer that stays silent past the peer timeout is
// told from one whose connection closed, so that a consumer can end the
// READs of the one and let those of the other run on.
func TestDeathSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		silent bool
	}{{"silent", true}, {"closed", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cl, c, _ := fakeProducer(t, ClientConfig{PingInterval: 20 * time.Millisecond, PeerTimeout: 200 * time.Millisecond})
			if !tc.silent {
				c.Close()
			} // else c answers no PING
			var dead []xfer.Death
			poll(t, 10*time.Second, "death", func() bool {
				dead = cl.Dead(dead)
				return len(dead) > 0
			})
			if dead[0].Err == nil || errors.Is(dead[0].Err, xfer.ErrPeerSilent) != tc.silent {
				t.Fatalf("death %+v: silent %v", dead[0], tc.silent)
			}
		})
	}
}
