package session

import (
	"errors"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/internal/fsm"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// A failure carries the error the session had when it ended the
// transfer: an ack's decode error, a lease's, a failed READ's, a refused
// post's. The Reason says which class; Err says what happened.
func TestFailureCarriesItsCause(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reason xfer.Reason
		want   error
		run    func(t *testing.T, co *consumerOnly) Results
	}{
		{"ack with an unknown status", xfer.BadAck, wire.ErrInvalid, func(t *testing.T, co *consumerOnly) Results {
			odd, _ := msgpack.Marshal(map[string]any{"type": "ack", "mm_hash": "H", "status": 9, "session_id": co.c.id})
			return co.poll(at(time.Millisecond), odd)
		}},
		{"OK ack with a field of the wrong type", xfer.BadAck, wire.ErrInvalid, func(t *testing.T, co *consumerOnly) Results {
			odd, _ := msgpack.Marshal(map[string]any{"type": "ack", "mm_hash": "H", "status": 0, "session_id": co.c.id, "src_block_indices": "3"})
			return co.poll(at(time.Millisecond), odd)
		}},
		{"OK ack past its lease", xfer.LateCompletion, fsm.ErrLeaseOver, func(t *testing.T, co *consumerOnly) Results {
			ack := wire.XferAck{MMHash: "H", Status: wire.OK, SessionID: co.c.id, AgentMetadata: co.prod.AgentMetadata(),
				SrcBlockIndices: []wire.Int{wire.IntOf(3)}, LeaseMillis: 5000, Attempt: co.lastAttempt(t)}
			return co.poll(at(5*time.Second+time.Millisecond), wire.AppendAck(nil, &ack))
		}},
		{"READ seen done past its lease", xfer.LateCompletion, fsm.ErrLeaseOver, func(t *testing.T, co *consumerOnly) Results {
			co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
			co.poll(at(time.Second), co.ok("H", 1))
			co.data.Finish(co.data.Posts()[0].Handle)
			return co.poll(at(32 * time.Second))
		}},
		{"READ failed", xfer.ReadError, xfake.ErrInjected, func(t *testing.T, co *consumerOnly) Results {
			co.data.SetOutcome(xfake.Outcome{Kind: xfake.FailAfter, After: 1})
			co.poll(at(time.Second), co.ok("H", 1)) // posted, seen in progress
			return co.poll(at(2 * time.Second))
		}},
		{"refused post", xfer.PostFailed, xfake.ErrInjected, func(t *testing.T, co *consumerOnly) Results {
			co.data.SetPostError(xfake.ErrInjected)
			return co.poll(at(time.Second), co.ok("H", 1))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := newConsumer(t)
			mustStart(t, co.c, "H", []int{1}, at(40*time.Second))
			r := tc.run(t, co)
			if len(r.Failed) != 1 || r.Failed[0].Reason != tc.reason {
				t.Fatalf("results %+v, want one failure %v", r, tc.reason)
			}
			if err := r.Failed[0].Err; !errors.Is(err, tc.want) {
				t.Fatalf("failure's error %v, want one that wraps %v", err, tc.want)
			}
		})
	}
}
