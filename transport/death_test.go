package transport

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
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

// A producer that refuses connections: each death carries the network's
// error under the address the user gave (no internal URL), and a loop that
// keeps dialing it logs one warning, not one per attempt.
func TestDeadProducerLogsOnce(t *testing.T) {
	rec := &countingHandler{}
	c := NewClient(ClientConfig{ConnectTimeout: 500 * time.Millisecond, Logger: slog.New(rec)})
	defer c.Close()
	addr := "tcp://127.0.0.1:1"
	for range 10 {
		if err := c.Send(addr, []byte("x")); err != nil {
			t.Fatal(err)
		}
		var dead []xfer.Death
		poll(t, 10*time.Second, "death", func() bool {
			dead = c.Dead(dead)
			return len(dead) > 0
		})
		err := dead[0].Err
		if !errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "guard") || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Fatalf("death: %v", err)
		}
	}
	if w := rec.warns.Load(); w != 1 {
		t.Fatalf("%d warnings for one dead producer dialed 10 times", w)
	}
}

type countingHandler struct{ warns atomic.Int32 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warns.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
