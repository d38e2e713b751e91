package session

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/xfer"
)

// nixlLike is a data plane that, as nixl.Agent does, needs the mem
// descriptor to register a producer, and whose load of the producer can
// fail after registering (the READ's post then says xfer.ErrUnknownPeer).
type nixlLike struct {
	xfer.DataTransport
	failPosts int
}

func (n *nixlLike) AddRemotePeer(meta, desc []byte) (xfer.Peer, error) {
	if len(desc) == 0 {
		return xfer.Peer{}, errors.New("nixl-like: empty metadata or descriptor")
	}
	return n.DataTransport.AddRemotePeer(meta, desc)
}

func (n *nixlLike) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	if n.failPosts > 0 {
		n.failPosts--
		return 0, fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	return n.DataTransport.PostRead(local, agent, remote, notif)
}

// A post refused with xfer.ErrUnknownPeer drops the registration "so the
// next ack registers the producer again" (the package doc's first
// difference from the reference). But a Go producer leaves the descriptor
// out of every ack to a consumer session that has completed a READ
// (cs.confirmed), whatever its request says
// (no ecx_known now): over NIXL the next ack cannot register the
// producer, and neither can any later one. Every later fetch of the
// session is tombstoned (register-failed) until the session goes.
func TestReRegisterAfterUnknownPeer(t *testing.T) {
	fab := xfake.NewFabric()
	cdata := &nixlLike{DataTransport: fab.New("cons", 64, 8)}
	pdata := fab.New("prod", 64, 8)
	ec := cache.NewEmbeddingCache(64)
	for _, h := range []string{"A", "B", "C", "D"} {
		ec.Alloc(h, 1)
		ec.MarkReady(h)
	}
	p := must(NewProducerSession(ProducerConfig{Logger: quiet}, pdata, ec, compat))
	toProd, toCons := &queue{}, &queue{}
	c := must(NewConsumerSession(ConsumerConfig{Logger: quiet, Rand: newSeeded(3)}, toProd, cdata, compat))
	now := t0
	var r Results
	fetch := func(h string, block int) Results {
		t.Helper()
		if err := c.StartXfer(h, []int{block}, now.Add(time.Second), now); err != nil {
			t.Fatal(err)
		}
		r.Reset()
		for range 5 {
			now = now.Add(time.Millisecond)
			var msgs []xfer.Message
			for _, m := range toProd.take() {
				msgs = append(msgs, xfer.Message{Identity: []byte("c"), Payload: m})
			}
			p.Poll(msgs, toCons, now)
			c.Poll(toCons.take(), now)
			c.TakeResults(&r)
		}
		return r
	}
	if r := fetch("A", 1); len(r.Completed) != 1 {
		t.Fatalf("A: %+v", r)
	}
	cdata.failPosts = 1 // the data plane lost the producer's load
	if r := fetch("B", 2); len(r.tombstoned()) != 1 {
		t.Fatalf("B: %+v", r)
	}
	for i, h := range []string{"C", "D"} {
		if r := fetch(h, 3+i); len(r.Completed) != 1 {
			t.Fatalf("%s after the registration was dropped: %+v (producer sent %d descriptors)", h, r, p.Stats().DescsSent)
		}
	}
}
