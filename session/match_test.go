package session

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/internal/fsm"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// The matching rule, cell by cell: every kind of reply, naming the
// current attempt, an earlier one, a later one, another session's, or no
// attempt, reaching a transfer waiting for its ack, reading, quarantined or
// ended. A reply acts only when it answers the current attempt of a
// transfer waiting for its ack; every other is dropped and counted.
//
// The history behind every cell: attempt 1 of H goes out at t0 and times
// out at 3 s without a reply; attempt 2 goes out at 3.5 s. The reply under
// test arrives at 6.5 s: past attempt 1's lease (5 s advertised, 6 s
// configured), inside attempt 2's, so a reply taken for the wrong attempt
// would show in the lease arithmetic too.
func TestReplyMatchingTable(t *testing.T) {
	const (
		advertised = 5 * time.Second
		configured = 6 * time.Second
	)
	sent1, sent2, arrive := t0, at(3500*time.Millisecond), at(6500*time.Millisecond)

	type which int
	const (
		current which = iota
		earlier
		later
		otherSession
		unnamed
	)
	whichNames := []string{"current", "earlier", "later", "another-session", "no-attempt"}

	type state int
	const (
		waiting state = iota
		reading
		quarantined
		ended
	)
	stateNames := []string{"waiting", "reading", "quarantined", "ended"}

	// kinds: the OK ack, a NACK of every status, a NACK whose status is
	// unknown, and a reply that does not decode for another reason.
	type kind struct {
		name   string
		status wire.Status // for OK and the NACKs
		broken string      // "status": unknown status; "blocks": undecodable block list
	}
	kinds := []kind{{name: "ok", status: wire.OK}}
	for s := wire.NackMissing; s <= wire.NackNotReady; s++ {
		kinds = append(kinds, kind{name: s.String(), status: s})
	}
	kinds = append(kinds, kind{name: "unknown-status", broken: "status"}, kind{name: "undecodable", broken: "blocks"})

	for _, k := range kinds {
		for w := current; w <= unnamed; w++ {
			for st := waiting; st <= ended; st++ {
				t.Run(fmt.Sprintf("%s/%s/%s", k.name, whichNames[w], stateNames[st]), func(t *testing.T) {
					co := newConsumerWith(t, xfer.Config{PinLease: configured})
					other := newConsumerWith(t, xfer.Config{})
					mustStart(t, other.c, "H", []int{9}, at(time.Hour))
					otherAttempt := other.lastAttempt(t)

					named := w != unnamed
					// A reply in the cell's peer's form; an OK ack grants
					// blocks 9 and 10, or 7 and 8 for attempt 1's grant.
					ack := func(attempt uint64, sid string, status wire.Status, src ...int64) []byte {
						a := wire.XferAck{MMHash: "H", Status: status}
						if named {
							a.Attempt = attempt
						}
						if status == wire.OK {
							a.SessionID, a.AgentMetadata = sid, co.prod.AgentMetadata()
							if len(src) == 0 {
								src = []int64{9, 10}
							}
							for _, b := range src {
								a.SrcBlockIndices = append(a.SrcBlockIndices, wire.IntOf(b))
							}
							if named {
								a.LeaseMillis = uint64(advertised.Milliseconds())
							}
						}
						return encAck(a) // a NACK echoes no session id
					}
					grant1 := func() []byte { return ack(0, co.c.id, wire.OK, 7, 8) }

					// The history.
					mustStart(t, co.c, "H", []int{1, 2}, at(3*time.Second))
					a1 := co.lastAttempt(t)
					if r := co.poll(at(3*time.Second + time.Millisecond)); len(r.retryable()) != 1 {
						t.Fatalf("attempt 1: %+v", r)
					}
					if err := co.c.StartXfer("H", []int{1, 2}, at(7500*time.Millisecond), sent2); err != nil {
						t.Fatal(err)
					}
					a2 := co.lastAttempt(t)
					co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
					if st != waiting {
						// Attempt 2's ack at 4 s, in the cell's peer's
						// form: a vLLM producer first answers attempt 1.
						msgs := [][]byte{ack(a2, co.c.id, wire.OK)}
						if !named {
							msgs = [][]byte{grant1(), ack(0, co.c.id, wire.OK)}
						}
						if r := co.poll(at(4*time.Second), msgs...); r.Len() != 0 || len(co.data.Posts()) != 1 {
							t.Fatalf("attempt 2's READ: %+v, posts %d", r, len(co.data.Posts()))
						}
					}
					switch st {
					case quarantined:
						if err := co.c.Cancel("H", at(4500*time.Millisecond)); err != nil {
							t.Fatal(err)
						}
						if r := co.poll(at(4500 * time.Millisecond)); len(r.quarantined()) != 1 {
							t.Fatalf("quarantine: %+v", r)
						}
					case ended:
						co.data.Finish(co.data.Posts()[0].Handle)
						if r := co.poll(at(4500 * time.Millisecond)); len(r.Completed) != 1 {
							t.Fatalf("completion: %+v", r)
						}
					}

					// The reply under test.
					attempt, sessionID := a2, co.c.id
					switch w {
					case earlier:
						attempt = a1
					case later:
						attempt = a2 + 1000 // never sent by this session
					case otherSession:
						attempt, sessionID = otherAttempt, other.c.id
					}
					var reply []byte
					switch k.broken {
					case "":
						reply = ack(attempt, sessionID, k.status)
					default:
						m := map[string]any{"type": "ack", "mm_hash": "H", "status": 9}
						if k.broken == "blocks" {
							m["status"], m["src_block_indices"] = 0, "seven"
						}
						if named {
							m["ecx_attempt"] = attempt
						}
						if k.broken == "blocks" { // an OK ack: it echoes the session id
							m["session_id"] = sessionID
						}
						reply, _ = msgpack.Marshal(m)
					}
					msgs := [][]byte{reply}
					if !named {
						// Attempt 1's delayed grant comes first, as a vLLM
						// producer sends it: it answers attempt 1 if that
						// is still unanswered.
						msgs = [][]byte{grant1(), reply}
					}
					before := co.c.Stats()
					posts := len(co.data.Posts())
					r := co.poll(arrive, msgs...)
					after := co.c.Stats()

					// What the rule says: only a reply that answers
					// attempt 2 acts, and only while it waits, whether
					// or not the rest of it decodes (its attempt is read
					// either way).
					decodable := k.broken == ""
					acts := st == waiting && (w == unnamed || w == current)
					dropped := len(msgs)
					if acts {
						dropped--
					}
					foreign, stray := 0, dropped
					if w == otherSession && (k.status == wire.OK && decodable || k.broken == "blocks") {
						foreign, stray = dropped, 0 // it echoes the other session's id
					}
					if got := int(after.StrayAcks - before.StrayAcks); got != stray {
						t.Errorf("stray acks %d, want %d", got, stray)
					}
					if got := int(after.ForeignAcks - before.ForeignAcks); got != foreign {
						t.Errorf("foreign acks %d, want %d", got, foreign)
					}
					if got := int(after.Malformed - before.Malformed); !decodable && got != 1 {
						t.Errorf("malformed %d, want 1", got)
					}

					if !acts {
						if r.Len() != 0 || len(co.data.Posts()) != posts {
							t.Fatalf("a dropped reply acted: %+v, posts %d -> %d", r, posts, len(co.data.Posts()))
						}
						want := map[state]int{waiting: 1, reading: 1, quarantined: 1, ended: 0}[st]
						if co.c.InFlight() != want {
							t.Fatalf("in flight %d, want %d", co.c.InFlight(), want)
						}
						if x := co.c.byHash["H"]; st == waiting && x.State() != fsm.WaitingAck || st == reading && x.State() != fsm.Reading {
							t.Fatalf("state %s", x.State())
						}
						return
					}
					switch {
					case !decodable:
						if len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.BadAck || r.Len() != 1 {
							t.Fatalf("results %+v", r)
						}
					case k.status == wire.OK:
						// The READ: posted at 6.5 s, its lease counted from
						// attempt 2's send, with the lease the ack
						// advertised (else the configured one).
						lease := configured
						if named {
							lease = advertised
						}
						x := co.c.byHash["H"]
						if r.Len() != 0 || len(co.data.Posts()) != posts+1 || x.State() != fsm.Reading {
							t.Fatalf("results %+v, posts %d", r, len(co.data.Posts()))
						}
						if p := co.data.Posts()[posts]; !slices.Equal(p.Remote, []int{9, 10}) {
							t.Fatalf("READ of blocks %v, not attempt 2's", p.Remote)
						}
						if !x.SentAt().Equal(sent2) || !x.LeaseEnd().Equal(sent2.Add(lease)) || arrive.After(x.LeaseEnd()) {
							t.Fatalf("lease end +%v, sent +%v; attempt 1 sent +%v", x.LeaseEnd().Sub(t0), x.SentAt().Sub(t0), sent1.Sub(t0))
						}
						co.data.Finish(co.data.Posts()[posts].Handle)
						if r := co.poll(x.LeaseEnd()); !slices.Equal(hashes(r.Completed), []string{"H"}) {
							t.Fatalf("done at the lease's end: %+v", r)
						}
					default:
						got := r.tombstoned()
						if k.status.Retryable() {
							got = r.retryable()
						}
						if r.Len() != 1 || len(got) != 1 || got[0].Status != k.status || got[0].Reason != xfer.Nacked {
							t.Fatalf("results %+v", r)
						}
					}
					if co.c.InFlight() != 0 && k.status != wire.OK {
						t.Fatal("the transfer is still in flight")
					}
				})
			}
		}
	}
}

// A READ's completion acts on the transfer whose READ it is, and on no
// other: not on another session's transfer of the same mm_hash over the
// same data plane, not on another mm_hash's. (A completion carries its
// handle, not an attempt: a READ is posted for the current attempt only.)
func TestCompletionMatchesItsRead(t *testing.T) {
	fab := xfake.NewFabric()
	data, prod := fab.New("cons", 64, 16), fab.New("prod", 64, 16)
	start := func(c *ConsumerSession, out *queue, h string, blocks ...int) {
		t.Helper()
		mustStart(t, c, h, blocks, at(time.Hour))
		var r wire.XferReq
		wire.DecodeReq(out.msgs[len(out.msgs)-1], &r)
		ack := wire.XferAck{MMHash: h, Status: wire.OK, SessionID: c.id, AgentMetadata: prod.AgentMetadata(),
			SrcBlockIndices: []wire.Int{wire.IntOf(int64(blocks[0]))}, Attempt: r.Attempt}
		c.Poll([][]byte{encAck(ack)}, t0)
	}
	for _, st := range []string{"waiting", "reading", "quarantined", "ended"} {
		t.Run(st, func(t *testing.T) {
			data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
			outA, outB := &queue{}, &queue{}
			a := must(NewConsumerSession(ConsumerConfig{Logger: quiet}, outA, data, compat))
			b := must(NewConsumerSession(ConsumerConfig{Logger: quiet}, outB, data, compat))
			// Another session's READ of H, and another mm_hash's here.
			start(b, outB, "H", 1)
			start(a, outA, "G", 2)
			var mine xfer.Handle
			switch st {
			case "waiting":
				mustStart(t, a, "H", []int{3}, at(time.Hour))
			default:
				start(a, outA, "H", 3)
				mine = data.Posts()[len(data.Posts())-1].Handle
			}
			switch st {
			case "quarantined":
				a.Cancel("H", t0)
			case "ended":
				data.Finish(mine)
			}
			var r Results
			a.Poll(nil, t0)
			a.TakeResults(&r)
			r.Reset()
			// Every other READ completes.
			for _, p := range data.Posts() {
				if p.Handle != mine {
					data.Finish(p.Handle)
				}
			}
			a.Poll(nil, at(time.Second))
			a.TakeResults(&r)
			if !slices.Equal(hashes(r.Completed), []string{"G"}) || r.Len() != 1 {
				t.Fatalf("after other READs ended: %+v", r)
			}
			want := map[string]int{"waiting": 1, "reading": 1, "quarantined": 1, "ended": 0}[st]
			if a.InFlight() != want {
				t.Fatalf("in flight %d, want %d", a.InFlight(), want)
			}
			if mine == 0 || st == "ended" {
				return
			}
			data.Finish(mine)
			r.Reset()
			a.Poll(nil, at(2*time.Second))
			a.TakeResults(&r)
			got := r.Completed
			if st == "quarantined" {
				got = r.settled()
			}
			if !slices.Equal(hashes(got), []string{"H"}) || r.Len() != 1 {
				t.Fatalf("its own READ ended: %+v", r)
			}
		})
	}
}
