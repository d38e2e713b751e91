package session

import (
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// split cuts fuzz input into messages: each starts with a length byte.
func split(data []byte) [][]byte {
	var msgs [][]byte
	for len(data) > 0 {
		n := min(int(data[0]), len(data)-1)
		msgs = append(msgs, data[1:1+n])
		data = data[1+n:]
	}
	return msgs
}

func frame(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = append(out, byte(len(m)))
		out = append(out, m...)
	}
	return out
}

// Random bytes from a producer never panic the consumer, and every
// transfer still ends exactly once, with no handle or peer left after Close.
func FuzzConsumerPoll(f *testing.F) {
	sid := "00000000-0000-4000-8000-000000000001"
	f.Add(frame(ackOK("A", sid, []byte("fake:prod:0:64"), 1), ackOK("B", "", []byte("fake:prod:0:64"), 2, 3)))
	f.Add(frame(encAck(wire.XferAck{MMHash: "A", Status: wire.NackNotReady}), []byte{0xc1}))
	f.Add(frame(ackOK("A", sid, []byte("fake:prod:0:64"), 1, 1), ackOK("B", sid, []byte("fake:prod:1:64"), 99)))
	// Registered from a shape: the producer's region's, then another.
	shaped := func(h string, b wire.Blocks) []byte {
		return encAck(wire.XferAck{MMHash: h, Status: wire.OK, SessionID: sid, AgentMetadata: []byte("fake:prod:0:64"),
			SrcBlockIndices: []wire.Int{wire.IntOf(5)}, Shape: b})
	}
	f.Add(frame(shaped("A", wire.Blocks{Base: 0x10000, Size: 8, Count: 64}), shaped("B", wire.Blocks{Base: 0x10000, Size: 8, Count: 63})))
	f.Fuzz(func(t *testing.T, data []byte) {
		fab := xfake.NewFabric()
		cdata := fab.New("cons", 64, 8)
		fab.New("prod", 64, 8)
		c, _ := NewConsumerSession(ConsumerConfig{Logger: quiet, Rand: newSeeded(1)}, &queue{}, cdata, compat)
		started := map[string]bool{"A": true, "B": true, "C": true}
		mustStart(t, c, "A", []int{1}, at(time.Second))
		mustStart(t, c, "B", []int{2, 3}, at(time.Second))
		mustStart(t, c, "C", []int{4}, at(time.Hour))
		ended := map[string]int{}
		var r Results
		take := func() {
			r.Reset()
			c.TakeResults(&r)
			for _, set := range [][]Outcome{r.Completed, r.tombstoned(), r.retryable()} {
				for _, o := range set {
					ended[o.MMHash]++
				}
			}
		}
		c.Poll(split(data), at(0))
		take()
		c.Poll(split(data), at(500*time.Millisecond)) // the same bytes again
		take()
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		r.Reset()
		c.TakeResults(&r)
		for _, set := range [][]Outcome{r.Completed, r.tombstoned(), r.retryable(), r.settled()} {
			for _, o := range set {
				ended[o.MMHash]++
			}
		}
		for h := range started {
			if ended[h] != 1 {
				t.Fatalf("%s ended %d times", h, ended[h])
			}
		}
		cdata.CheckNoLeaks(t)
	})
}

// Random bytes from consumers never panic the producer, and every entry's
// pins equal its live grants; Close releases them all.
func FuzzProducerPoll(f *testing.F) {
	sid := "00000000-0000-4000-8000-000000000001"
	f.Add(frame(req("R", sid), req("R", sid), req("N", sid), req("X", "")))
	f.Add(frame([]byte{0x80}, []byte{0xc1}, req("R", "not-a-uuid")))
	f.Add(frame(req("R", sid), wire.AppendReq(nil, &wire.XferReq{MMHash: "R", CompatibilityHash: "other", SessionID: sid})))
	f.Fuzz(func(t *testing.T, data []byte) {
		data2 := append([]byte(nil), data...)
		pdata := xfake.New("prod", 16, 8)
		c := cache.NewEmbeddingCache(16)
		c.Alloc("R", 2)
		c.MarkReady("R")
		c.Alloc("N", 1)
		p := must(NewProducerSession(ProducerConfig{Logger: quiet, MaxGrantsPerSession: 3, MaxGrants: 5}, pdata, c, compat))
		var msgs []xfer.Message
		for i, m := range split(data) {
			msgs = append(msgs, xfer.Message{Identity: []byte{byte(i)}, Payload: m})
		}
		check := func() {
			counts := map[string]int{}
			p.pinCounts(counts)
			for _, h := range []string{"R", "N"} {
				if e, _ := c.Get(h); e.Pins != counts[h] {
					t.Fatalf("%s: %d pins, %d grants", h, e.Pins, counts[h])
				}
			}
			if p.Grants() > 5 {
				t.Fatalf("%d grants over the bound", p.Grants())
			}
		}
		p.Poll(msgs, &queue{}, at(0))
		check()
		pdata.InjectNotif("c", data2) // the bytes as a notification too
		p.Poll(msgs, &queue{}, at(time.Second))
		check()
		p.Close()
		check()
		p.Poll(nil, &queue{}, at(time.Hour)) // the leases of what Close kept
		if e, _ := c.Get("R"); e.Pins != 0 {
			t.Fatalf("%d pins after Close and the leases", e.Pins)
		}
	})
}
