package session_test

import (
	"bytes"
	"fmt"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session"
	"github.com/ecxfer/ecxfer/xfer"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

// queue is a control plane in memory: what one side sends, the other polls.
type queue struct{ msgs [][]byte }

func (q *queue) Send(p []byte) error     { q.msgs = append(q.msgs, bytes.Clone(p)); return nil }
func (q *queue) Reply(_, p []byte) error { return q.Send(p) }
func (q *queue) take() (m [][]byte)      { m, q.msgs = q.msgs, nil; return m }
func (q *queue) requests() []xfer.Message { // as a producer's control plane hands them over
	var out []xfer.Message
	for _, p := range q.take() {
		out = append(out, xfer.Message{Identity: []byte("consumer-1"), Payload: p})
	}
	return out
}

// The two sessions are sans-I/O: bytes and the time go in, bytes and
// results come out. Here they run on a fake clock, over an in-memory
// control plane and xfertest's fake data plane: the shape of a
// deterministic test of an engine's integration.
func Example() {
	pair := xfertest.FakePair(16, 64)
	consData, prodData := pair.Consumer, pair.Producer

	// The producer holds one ready entry.
	entries := cache.NewEmbeddingCache(16)
	e, err := entries.Alloc("img-1", 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	copy(pair.ProducerBlock(e.Blocks[0]), "hello, ")
	copy(pair.ProducerBlock(e.Blocks[1]), "embedding")
	if err := entries.MarkReady("img-1"); err != nil {
		fmt.Println(err)
		return
	}
	prod, err := session.NewProducerSession(session.ProducerConfig{}, prodData, entries, "compat")
	if err != nil {
		fmt.Println(err)
		return
	}

	toProducer, toConsumer := &queue{}, &queue{}
	cons, err := session.NewConsumerSession(session.ConsumerConfig{}, toProducer, consData, "compat")
	if err != nil {
		fmt.Println(err)
		return
	}

	now := time.Unix(1_700_000_000, 0) // the fake clock
	if err := cons.StartXfer("img-1", []int{5, 6}, now.Add(2*time.Second), now); err != nil {
		fmt.Println(err)
		return
	}
	var r session.Results
	for step := 0; cons.InFlight() > 0; step++ {
		now = now.Add(10 * time.Millisecond)
		prod.Poll(toProducer.requests(), toConsumer, now)
		cons.Poll(toConsumer.take(), now)
		cons.TakeResults(&r)
	}
	fmt.Printf("completed %d: %s%s\n", len(r.Completed), bytes.TrimRight(pair.ConsumerBlock(5), "\x00"), bytes.TrimRight(pair.ConsumerBlock(6), "\x00"))

	// The completion notification reaches the producer: the pin goes.
	prod.Poll(nil, toConsumer, now.Add(10*time.Millisecond))
	fmt.Println("grants left:", prod.Grants())
	// Output:
	// completed 1: hello, embedding
	// grants left: 0
}
