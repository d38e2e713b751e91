package session

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/wire"
)

var t0 = time.Unix(1_700_000_000, 0)

func at(d time.Duration) time.Time { return t0.Add(d) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const compat = "compat-hash"

// queue is an in-memory control channel: Send and Reply append copies.
type queue struct {
	msgs [][]byte
	ids  [][]byte
	err  error
}

func (q *queue) Send(p []byte) error {
	if q.err != nil {
		return q.err
	}
	q.msgs = append(q.msgs, bytes.Clone(p))
	return nil
}

func (q *queue) Reply(id, p []byte) error {
	if q.err != nil {
		return q.err
	}
	q.ids = append(q.ids, bytes.Clone(id))
	q.msgs = append(q.msgs, bytes.Clone(p))
	return nil
}

// take empties the queue.
func (q *queue) take() [][]byte {
	m := q.msgs
	q.msgs, q.ids = nil, nil
	return m
}

// seeded is a deterministic source of session ids.
type seeded struct{ r *rand.ChaCha8 }

func (s seeded) Read(p []byte) (int, error) { return s.r.Read(p) }

func newSeeded(seed byte) io.Reader { return seeded{rand.NewChaCha8([32]byte{seed})} }

func mustStart(t *testing.T, c *ConsumerSession, h string, blocks []int, deadline time.Time) {
	t.Helper()
	if err := c.StartXfer(h, blocks, deadline, t0); err != nil {
		t.Fatal(err)
	}
}

func hashes(os []Outcome) []string {
	var s []string
	for _, o := range os {
		s = append(s, o.MMHash)
	}
	return s
}

func encAck(a wire.XferAck) []byte { return wire.AppendAck(nil, &a) }

func ackOK(h, sid string, meta []byte, ids ...int64) []byte {
	a := wire.XferAck{MMHash: h, Status: wire.OK, SessionID: sid, AgentMetadata: meta}
	for _, id := range ids {
		a.SrcBlockIndices = append(a.SrcBlockIndices, wire.IntOf(id))
	}
	return encAck(a)
}

var errSend = errors.New("send refused")

// must returns v, panicking on err: for constructors in tests.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The reference's words for the outcomes, as the tests check them: a
// failure that is not worth retrying is vLLM's "tombstoned", one that is
// its "retryable", one whose READ may still write its "quarantined", and
// the release of its blocks its "settled".
func (r Results) tombstoned() []Outcome {
	return filter(r.Failed, func(o Outcome) bool { return !o.Retry && !o.BlocksHeld })
}
func (r Results) retryable() []Outcome {
	return filter(r.Failed, func(o Outcome) bool { return o.Retry })
}
func (r Results) quarantined() []Outcome {
	return filter(r.Failed, func(o Outcome) bool { return o.BlocksHeld })
}
func (r Results) settled() []Outcome { return r.Released }

func filter(os []Outcome, keep func(Outcome) bool) []Outcome {
	var out []Outcome
	for _, o := range os {
		if keep(o) {
			out = append(out, o)
		}
	}
	return out
}
