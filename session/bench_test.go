package session

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// benchData is a data plane that costs nothing: READs stay in progress and
// notifications are whatever the benchmark queues.
type benchData struct {
	meta, desc []byte
	next       xfer.Handle
	notifs     []xfer.Notif
}

func (d *benchData) AgentMetadata() []byte { return d.meta }
func (d *benchData) MemDescriptor() []byte { return d.desc }
func (d *benchData) AddRemotePeer(m, _ []byte) (xfer.Peer, error) {
	return xfer.Peer{Agent: "p", Blocks: 1 << 20}, nil
}
func (d *benchData) RemoveRemotePeer(string) error { return nil }
func (d *benchData) PostRead(_ []int, _ string, _ []int, _ []byte) (xfer.Handle, error) {
	d.next++
	return d.next, nil
}
func (d *benchData) Check(xfer.Handle) (xfer.Progress, error) { return xfer.InProgress, nil }
func (d *benchData) Release(xfer.Handle) error                { return nil }
func (d *benchData) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) {
	dst = append(dst, d.notifs...)
	d.notifs = d.notifs[:0]
	return dst, nil
}
func (d *benchData) Close() error { return nil }

type nopSender struct{}

func (nopSender) Send([]byte) error       { return nil }
func (nopSender) Reply(_, _ []byte) error { return nil }

// Consumer Poll with n READs in flight and no messages: the per-step cost of
// following transfers.
func BenchmarkConsumerPoll(b *testing.B) {
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("inflight=%d", n), func(b *testing.B) {
			data := &benchData{meta: []byte("m")}
			c, err := NewConsumerSession(ConsumerConfig{Logger: quiet}, nopSender{}, data, compat)
			if err != nil {
				b.Fatal(err)
			}
			var acks [][]byte
			for i := range n {
				h := fmt.Sprintf("%064x", i)
				if err := c.StartXfer(h, []int{2 * i, 2*i + 1}, at(1<<40), at(0)); err != nil {
					b.Fatal(err)
				}
				acks = append(acks, ackOK(h, c.id, data.meta, int64(2*i), int64(2*i+1)))
			}
			c.Poll(acks, at(0))
			if c.InFlight() != n || len(c.active) != n {
				b.Fatalf("%d in flight", c.InFlight())
			}
			now := at(1)
			b.ReportAllocs()
			for b.Loop() {
				c.Poll(nil, now)
			}
		})
	}
}

// Producer grants through Poll: decode the request, pin, encode and reply
// the ack. One grant per op. "first": the consumer session has not
// completed a READ yet, so every ack carries the region's mem descriptor
// (each op re-requests once the previous grant's lease ran out). "steady": it has, so acks
// leave the descriptor out, and the completion notification ends each
// grant. "steady-authorize": the same with the READ authorized before its
// notification, as a data plane that gates READs (the TCP one) does; NIXL
// does not.
func BenchmarkProducerGrant(b *testing.B) {
	for _, blocks := range []int{512, 100000} {
		for _, mode := range []string{"first", "steady", "steady-authorize"} {
			b.Run(fmt.Sprintf("region=%d/%s", blocks, mode), func(b *testing.B) {
				data := &benchData{meta: []byte(strings.Repeat("m", 200)), desc: wire.AppendBlockDescs(nil, 0x7f0000000000, 7168, blocks, 0)}
				c := cache.NewEmbeddingCache(blocks)
				h := strings.Repeat("ab", 32)
				e, err := c.Alloc(h, 8)
				if err != nil {
					b.Fatal(err)
				}
				c.MarkReady(h)
				p := must(NewProducerSession(ProducerConfig{Logger: quiet}, data, c, compat))
				authorize := mode == "steady-authorize"
				sid := "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9d"
				msgs := []xfer.Message{{Identity: []byte("consumer-1"), Payload: req(h, sid)}}
				notif := []xfer.Notif{{Agent: "c", Msg: []byte(sid + ":" + h)}}
				now := at(0)
				steady := mode != "first"
				if steady {
					p.Poll(msgs, nopSender{}, now)
					data.notifs = append(data.notifs, notif...)
				}
				var sink countingReplier
				b.ReportAllocs()
				for b.Loop() {
					if !steady {
						now = now.Add(time.Hour) // the last grant's lease ran out
					}
					p.Poll(msgs, &sink, now)
					if authorize {
						release, ok := p.authorizeRelease("c", notif[0].Msg, e.Blocks)
						if !ok {
							b.Fatal("READ of the grant refused")
						}
						release()
					}
					if steady {
						data.notifs = append(data.notifs, notif...)
					}
				}
				st := p.Stats()
				if steady && st.DescsSent > 2 || !steady && st.DescsSent != st.Grants {
					b.Fatalf("descriptors sent %d of %d grants", st.DescsSent, st.Grants)
				}
				if want := uint64(b.N) + map[bool]uint64{true: 1}[steady]; st.Grants != want {
					b.Fatalf("%d grants in %d ops", st.Grants, b.N)
				}
				b.ReportMetric(float64(sink.bytes)/float64(sink.n), "B/ack")
			})
		}
	}
}

type countingReplier struct{ n, bytes int }

func (c *countingReplier) Reply(_, p []byte) error {
	c.n++
	c.bytes += len(p)
	return nil
}

// grantedBig returns a producer session that granted session "a" entry
// "big" of n blocks (every other block, with holes), and its blocks.
func grantedBig(b *testing.B, n int, holes bool) (*ProducerSession, []int) {
	c := cache.NewEmbeddingCache(2 * n)
	if holes { // every other block taken by a small entry first
		for i := range n {
			c.Alloc(fmt.Sprint("pad", i), 1)
			c.Alloc(fmt.Sprint("gap", i), 1)
		}
		for i := range n {
			c.Discard(fmt.Sprint("gap", i))
		}
	}
	e, err := c.Alloc("big", n)
	if err != nil {
		b.Fatal(err)
	}
	c.MarkReady("big")
	p := must(NewProducerSession(ProducerConfig{Logger: quiet, MaxPinnedShare: 1}, xfake.New("prod", 2*n, 8), c, compat))
	p.Poll([]xfer.Message{{Identity: []byte("c"), Payload: req("big", sid("a"))}}, &queue{}, t0)
	return p, e.Blocks
}

// Authorize of a 16,384-block READ: the data plane calls it for every READ
// it serves, and it must not hold up the step loop.
func BenchmarkAuthorize16K(b *testing.B) {
	const n = 16384
	for _, tc := range []struct {
		name  string
		holes bool // the entry's blocks are not one run
		order func([]int)
	}{
		{"in-order", false, func([]int) {}},
		{"shuffled", false, func(s []int) { rand.New(rand.NewPCG(1, 1)).Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] }) }},
		{"shuffled-holes", true, func(s []int) { rand.New(rand.NewPCG(1, 1)).Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] }) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p, blocks := grantedBig(b, n, tc.holes)
			want := slices.Clone(blocks)
			tc.order(want)
			notif := []byte(sid("a") + ":big")
			b.ResetTimer()
			for range b.N {
				release, ok := p.authorizeRelease("cons", notif, want)
				if !ok {
					b.Fatal("refused")
				}
				release()
			}
		})
	}
}

// One 64 MiB entry of 8 KiB blocks (8,192), granted and fetched: the
// producer's grant (pin, encode and reply the ack; the notification ends
// it), and the consumer's handling of that ack up to its READ's post.
// These scale with the blocks: an entry of small blocks is where a
// per-block cost shows.
func BenchmarkLargeEntry(b *testing.B) {
	const n = 8192
	h := strings.Repeat("ab", 32)
	sid := "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9d"
	b.Run("producer-grant", func(b *testing.B) {
		data := &benchData{meta: []byte(strings.Repeat("m", 200)), desc: wire.AppendBlockDescs(nil, 0x7f0000000000, 8192, 2*n, 0)}
		c := cache.NewEmbeddingCache(2 * n)
		if _, err := c.Alloc(h, n); err != nil {
			b.Fatal(err)
		}
		c.MarkReady(h)
		p := must(NewProducerSession(ProducerConfig{Logger: quiet}, data, c, compat))
		msgs := []xfer.Message{{Identity: []byte("consumer-1"), Payload: req(h, sid)}}
		notif := []xfer.Notif{{Agent: "c", Msg: []byte(sid + ":" + h)}}
		now := at(0)
		p.Poll(msgs, nopSender{}, now)
		data.notifs = append(data.notifs, notif...)
		var sink countingReplier
		b.ReportAllocs()
		for b.Loop() {
			p.Poll(msgs, &sink, now)
			data.notifs = append(data.notifs, notif...)
		}
		if st := p.Stats(); st.Grants != uint64(b.N)+1 {
			b.Fatalf("%d grants in %d ops", st.Grants, b.N)
		}
		b.ReportMetric(float64(sink.bytes)/float64(sink.n), "B/ack")
	})
	b.Run("consumer-ack", func(b *testing.B) {
		data := &doneData{benchData{meta: []byte("m")}}
		c, err := NewConsumerSession(ConsumerConfig{Logger: quiet}, nopSender{}, data, compat)
		if err != nil {
			b.Fatal(err)
		}
		local, remote := make([]int, n), make([]int64, n)
		for i := range local {
			local[i], remote[i] = i, int64(n+i)
		}
		// The ack a Go producer sends: it names its grant, so every request
		// carries the session's id and one ack, replayed, answers each. An
		// ack naming no grant (vLLM's) would make later requests carry ids
		// of their own, which a replay of it does not echo.
		a := wire.XferAck{MMHash: h, Status: wire.OK, SessionID: c.id, AgentMetadata: data.meta,
			Grant: 1, Token: wire.Token{1}}
		for _, id := range remote {
			a.SrcBlockIndices = append(a.SrcBlockIndices, wire.IntOf(id))
		}
		acks := [][]byte{encAck(a)}
		now := at(0)
		var r Results
		fetch := func() {
			if err := c.StartXfer(h, local, now.Add(time.Hour), now); err != nil {
				b.Fatal(err)
			}
			c.Poll(acks, now)
			b.StopTimer()
			c.Poll(nil, now) // its READ completes
			c.TakeResults(&r)
			if len(r.Completed) != 1 {
				b.Fatalf("the ack completes nothing: results %+v, stats %+v", r, c.Stats())
			}
			r.Reset()
			b.StartTimer()
		}
		// The first fetch registers the producer: each op after it is a
		// repeat, one -benchtime 1x runs too.
		fetch()
		b.ReportAllocs()
		for b.Loop() {
			fetch()
		}
	})
}

// doneData is benchData whose READs are complete when checked.
type doneData struct{ benchData }

func (d *doneData) Check(xfer.Handle) (xfer.Progress, error) { return xfer.Complete, nil }

// BenchmarkRefusedRead is the check of a 33-block READ under a live grant,
// refused (its first block is not the grant's), by the grant's entry size
// (scattered blocks): a READ a peer can repeat costs what its own ids
// take to search, not a pass over the entry.
func BenchmarkRefusedRead(b *testing.B) {
	for _, n := range []int{256, 16384} {
		b.Run(fmt.Sprint("entry=", n), func(b *testing.B) {
			p, blocks := grantedBig(b, n, true)
			in := map[int]bool{}
			for _, id := range blocks {
				in[id] = true
			}
			want := make([]int, 0, 33)
			for id := 0; len(want) == 0; id++ { // a block not the grant's
				if !in[id] {
					want = append(want, id)
				}
			}
			want = append(want, blocks[:32]...)
			notif := []byte(sid("a") + ":big")
			for b.Loop() {
				if _, ok := p.authorizeRelease("cons", notif, want); ok {
					b.Fatal("granted")
				}
			}
		})
	}
}
