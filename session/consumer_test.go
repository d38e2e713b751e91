package session

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// consumerOnly is a consumer whose producer is scripted by hand.
type consumerOnly struct {
	data *xfake.Fake
	prod *xfake.Fake
	out  *queue
	c    *ConsumerSession
}

func newConsumer(t *testing.T) *consumerOnly {
	t.Helper()
	fab := xfake.NewFabric()
	co := &consumerOnly{data: fab.New("cons", 64, 16), prod: fab.New("prod", 64, 16), out: &queue{}}
	var err error
	co.c, err = NewConsumerSession(ConsumerConfig{Logger: quiet}, co.out, co.data, compat)
	if err != nil {
		t.Fatal(err)
	}
	return co
}

func (co *consumerOnly) ok(h string, ids ...int64) []byte {
	return ackOK(h, sidOf(co.out.msgs, h), co.prod.AgentMetadata(), ids...)
}

// sidOf returns the session id of the last request for h in sent, as a
// producer echoes it.
func sidOf(sent [][]byte, h string) string {
	for i := len(sent) - 1; i >= 0; i-- {
		var r wire.XferReq
		if wire.DecodeReq(sent[i], &r) == nil && r.MMHash == h {
			return r.SessionID
		}
	}
	return ""
}

func (co *consumerOnly) poll(now time.Time, msgs ...[]byte) Results {
	co.c.Poll(msgs, now)
	var r Results
	co.c.TakeResults(&r)
	return r
}

func TestSessionID(t *testing.T) { // a stable random UUID, as the reference
	co := newConsumer(t)
	u, err := uuid.Parse(co.c.id)
	if err != nil || u.Version() != 4 || u.String() != co.c.id {
		t.Fatalf("id %q: %v", co.c.id, err)
	}
	other := newConsumer(t)
	if other.c.id == co.c.id {
		t.Fatal("two sessions share an id")
	}
}

func TestStartXferSendsRequest(t *testing.T) { // the request carries hash, session and compat hash
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1, 2}, at(2*time.Second))
	if len(co.out.msgs) != 1 {
		t.Fatalf("%d messages sent", len(co.out.msgs))
	}
	var req wire.XferReq
	if err := wire.DecodeReq(co.out.msgs[0], &req); err != nil {
		t.Fatal(err)
	}
	if req.MMHash != "H" || req.SessionID != co.c.id || req.CompatibilityHash != compat || req.Version() != wire.IntOf(2) {
		t.Fatalf("request %+v", req)
	}
	if !(co.c.InFlight() > 0) || co.c.InFlight() != 1 {
		t.Fatal("not in flight")
	}
}

func TestStartXferSendFails(t *testing.T) { // a refused send records nothing
	co := newConsumer(t)
	co.out.err = errSend
	if err := co.c.StartXfer("H", []int{1}, at(time.Second), t0); !errors.Is(err, errSend) {
		t.Fatalf("err %v", err)
	}
	if co.c.InFlight() > 0 {
		t.Fatal("a failed send left a transfer")
	}
	co.out.err = nil
	mustStart(t, co.c, "H", []int{1}, at(time.Second))
}

func TestStartXferBadBlocks(t *testing.T) {
	co := newConsumer(t)
	for _, blocks := range [][]int{{1, 1}, {3, -1}, {2, 5, 2}, {-1, 2}, {-3}} {
		if err := co.c.StartXfer("H", blocks, at(time.Second), t0); !errors.Is(err, ErrBadBlocks) {
			t.Fatalf("%v: %v", blocks, err)
		}
	}
	if len(co.out.msgs) != 0 || co.c.InFlight() > 0 {
		t.Fatal("a refused start sent a request")
	}
}

func TestStartXferInFlight(t *testing.T) { // a second start for an mm_hash in flight is an error
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	if err := co.c.StartXfer("H", []int{2}, at(2*time.Second), t0); !errors.Is(err, ErrInFlight) {
		t.Fatalf("err %v", err)
	}
	// Also while its READ is quarantined.
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	co.poll(at(time.Second), co.ok("H", 3))
	co.c.PeerDown(at(2 * time.Second))
	if err := co.c.StartXfer("H", []int{2}, at(3*time.Second), t0); !errors.Is(err, ErrInFlight) {
		t.Fatalf("quarantined: err %v", err)
	}
	if len(co.out.msgs) != 1 {
		t.Fatal("a refused start sent a request")
	}
}

func TestAckThenDoneInOnePoll(t *testing.T) { // ack and completion in one poll; the first ack registers the producer
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{4, 5}, at(2*time.Second))
	r := co.poll(at(time.Second), co.ok("H", 7, 8))
	if !slices.Equal(hashes(r.Completed), []string{"H"}) || len(r.tombstoned()) != 0 {
		t.Fatalf("results %+v", r)
	}
	if !slices.Equal(r.Completed[0].Blocks, []int{4, 5}) {
		t.Fatalf("blocks %v", r.Completed[0].Blocks)
	}
	if co.c.InFlight() > 0 || co.c.Stats().Registrations != 1 {
		t.Fatalf("in flight %v, registrations %d", co.c.InFlight() > 0, co.c.Stats().Registrations)
	}
}

func TestNacks(t *testing.T) { // NACK_NOT_READY retryable, other NACKs final
	for s := wire.NackMissing; s <= wire.NackNotReady; s++ {
		t.Run(s.String(), func(t *testing.T) {
			co := newConsumer(t)
			mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
			r := co.poll(at(time.Second), encAck(wire.XferAck{MMHash: "H", Status: s}))
			got := r.tombstoned()
			if s.Retryable() {
				got = r.retryable()
			}
			if r.Len() != 1 || len(got) != 1 || got[0].Status != s || got[0].Reason != xfer.Nacked {
				t.Fatalf("results %+v", r)
			}
			if co.c.InFlight() > 0 || len(co.data.Posts()) != 0 || co.c.Stats().Nacks[s] != 1 {
				t.Fatal("NACK left state behind")
			}
		})
	}
}

func TestAckTimeout(t *testing.T) { // tombstoned at the ack deadline, results taken once, no registration
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	if r := co.poll(at(2 * time.Second)); r.Len() != 0 {
		t.Fatalf("at the deadline: %+v", r)
	}
	r := co.poll(at(3 * time.Second))
	if !slices.Equal(hashes(r.retryable()), []string{"H"}) || r.retryable()[0].Reason != xfer.AckTimedOut {
		t.Fatalf("results %+v", r)
	}
	if r := co.poll(at(4 * time.Second)); r.Len() != 0 {
		t.Fatalf("second take: %+v", r)
	}
	if co.c.Stats().Registrations != 0 || len(co.data.Leaks().Peers) != 0 {
		t.Fatal("a timeout touched the registration")
	}
	// A late ack for it is a stray.
	co.poll(at(5*time.Second), co.ok("H", 1))
	if co.c.Stats().StrayAcks != 1 || len(co.data.Posts()) != 0 {
		t.Fatal("late ack was not ignored")
	}
}

// At the control connection's death, a transfer waiting for its ack is
// retryable; READs run on, on their data connection, and end as any
// other: one that completes is Completed, one that fails Tombstoned, one
// past its deadline Quarantined until it settles.
func TestPeerDown(t *testing.T) { // waiting: retryable; reading: quarantined (the reference leaks those blocks)
	co := newConsumer(t)
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	mustStart(t, co.c, "W", []int{1}, at(2*time.Second))
	mustStart(t, co.c, "R", []int{2, 3}, at(2*time.Second))
	mustStart(t, co.c, "F", []int{4}, at(2*time.Second))
	mustStart(t, co.c, "S", []int{5}, at(2*time.Second))
	co.poll(at(time.Second), co.ok("R", 5, 6), co.ok("F", 7), co.ok("S", 8))
	co.c.PeerDown(at(time.Second))
	var r Results
	co.c.TakeResults(&r)
	if !slices.Equal(hashes(r.retryable()), []string{"W"}) || r.retryable()[0].Reason != xfer.PeerDown {
		t.Fatalf("retryable %+v", r.retryable())
	}
	if r.Len() != 1 || co.c.InFlight() != 3 {
		t.Fatalf("READs judged at the control connection's death: %+v, %d in flight", r, co.c.InFlight())
	}
	posts := co.data.Posts()
	if r := co.poll(at(10 * time.Second)); r.Len() != 0 {
		t.Fatalf("%+v", r)
	}
	co.data.Finish(posts[0].Handle)
	co.data.FailRead(posts[1].Handle)
	r = co.poll(at(11 * time.Second))
	if !slices.Equal(hashes(r.Completed), []string{"R"}) || !slices.Equal(r.Completed[0].Blocks, []int{2, 3}) {
		t.Fatalf("completed %+v", r)
	}
	// A READ that failed ended: its blocks are free, and a new grant may serve it.
	if !slices.Equal(hashes(r.retryable()), []string{"F"}) || r.retryable()[0].Reason != xfer.ReadError {
		t.Fatalf("retryable %+v", r)
	}
	// S outlives its deadline: quarantined, followed until it settles.
	r = co.poll(at(22 * time.Second))
	if !slices.Equal(hashes(r.quarantined()), []string{"S"}) || r.quarantined()[0].Reason != xfer.ReadTimedOut {
		t.Fatalf("quarantined %+v", r)
	}
	co.data.Finish(posts[2].Handle)
	r = co.poll(at(23 * time.Second))
	if len(r.settled()) != 1 || r.settled()[0].MMHash != "S" || r.settled()[0].Forced {
		t.Fatalf("settled %+v", r.settled())
	}
	if co.c.InFlight() > 0 {
		t.Fatal("not cleaned up")
	}
	for _, p := range posts {
		if co.data.Releases(p.Handle) != 1 {
			t.Fatalf("handle %d released %d times", p.Handle, co.data.Releases(p.Handle))
		}
	}
}

func TestQuarantineSettlesInEveryPoll(t *testing.T) { // re-polled every poll; a failed check quarantines, not frees
	co := newConsumer(t)
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	mustStart(t, co.c, "H", []int{9}, at(2*time.Second))
	co.poll(at(time.Second), co.ok("H", 1))
	r := co.poll(at(22 * time.Second))
	if len(r.quarantined()) != 1 || r.quarantined()[0].Reason != xfer.ReadTimedOut {
		t.Fatalf("%+v", r)
	}
	r = co.poll(at(83 * time.Second))
	if len(r.settled()) != 1 || !r.settled()[0].Forced || r.settled()[0].Reason != xfer.QuarantineTimedOut {
		t.Fatalf("%+v", r)
	}
	if co.c.Stats().ForcedReleases != 1 {
		t.Fatal("forced settle not counted")
	}
}

func TestAckDispatchEdges(t *testing.T) { // stray and undecodable acks; bad acks checked; other sessions' acks counted
	co := newConsumer(t)
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	for _, h := range []string{"A", "B", "C", "D"} {
		mustStart(t, co.c, h, []int{1, 2}, at(2*time.Second))
	}
	r := co.poll(at(time.Second),
		[]byte{0xc1},       // malformed: dropped
		co.ok("zzz", 1, 2), // unknown mm_hash: ignored
		ackOK("A", "other-session", co.prod.AgentMetadata(), 1, 2), // foreign: ignored
		co.ok("B", 1),     // one source block for two local: bad ack
		co.ok("C", 3, 99), // outside the producer's 64 blocks
		ackOK("D", "", co.prod.AgentMetadata(), 4, 5), // empty echo accepted (reference NACK style)
		co.ok("D", 6, 7), // second ack for a READ posted: ignored
	)
	if !slices.Equal(hashes(r.tombstoned()), []string{"B", "C"}) || r.tombstoned()[0].Reason != xfer.BadAck {
		t.Fatalf("tombstoned %+v", r.tombstoned())
	}
	st := co.c.Stats()
	if st.Malformed != 1 || st.StrayAcks != 2 || st.ForeignAcks != 1 || st.BadAcks != 2 {
		t.Fatalf("stats %+v", st)
	}
	posts := co.data.Posts()
	if len(posts) != 1 || !slices.Equal(posts[0].Remote, []int{4, 5}) {
		t.Fatalf("posts %+v", posts)
	}
	// A is still waiting for its own ack.
	r = co.poll(at(3 * time.Second))
	if !slices.Equal(hashes(r.retryable()), []string{"A"}) {
		t.Fatalf("%+v", r)
	}
}

func TestRegistration(t *testing.T) { // registered once per metadata; a failed registration drops the transfer
	fab := xfake.NewFabric()
	data := fab.New("cons", 64, 16)
	prod := fab.New("prod", 64, 16)
	out := &queue{}
	c, err := NewConsumerSession(ConsumerConfig{Logger: quiet}, out, data, compat)
	if err != nil {
		t.Fatal(err)
	}
	var r Results
	step := func(h string, meta []byte, now time.Time) {
		mustStart(t, c, h, []int{1}, now.Add(time.Second))
		c.Poll([][]byte{ackOK(h, sidOf(out.msgs, h), meta, 2)}, now)
		c.TakeResults(&r)
	}
	step("A", prod.AgentMetadata(), at(0))
	step("B", prod.AgentMetadata(), at(1))
	if c.Stats().Registrations != 1 {
		t.Fatalf("same metadata registered %d times", c.Stats().Registrations)
	}
	// The producer restarts: new metadata, old agent removed first.
	prod2 := fab.New("prod", 64, 16)
	step("C", prod2.AgentMetadata(), at(2))
	if c.Stats().Registrations != 2 || len(data.Leaks().Peers) != 1 {
		t.Fatalf("registrations %d, peers %v", c.Stats().Registrations, data.Leaks().Peers)
	}
	// Registration fails: tombstoned, nothing posted.
	posts := len(data.Posts())
	data.SetAddPeerError(xfake.ErrInjected)
	r.Reset()
	step("D", []byte("fake:prod:9:64"), at(3))
	if len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.RegisterFailed || len(data.Posts()) != posts {
		t.Fatalf("%+v", r)
	}
	// Then a good ack registers again.
	data.SetAddPeerError(nil)
	r.Reset()
	step("E", prod2.AgentMetadata(), at(4))
	if len(r.Completed) != 1 {
		t.Fatalf("%+v", r)
	}
	c.Close()
	data.CheckNoLeaks(t)
}

func TestPostFailsTombstones(t *testing.T) { // a refused post tombstones that transfer only
	co := newConsumer(t)
	co.data.SetPostError(xfake.ErrInjected)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	r := co.poll(at(time.Second), co.ok("H", 1))
	if len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.PostFailed || co.c.InFlight() > 0 {
		t.Fatalf("%+v", r)
	}
}

func TestLateCompletion(t *testing.T) { // done after the lease: tombstoned, not promoted
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	co.poll(at(time.Second), co.ok("H", 1))
	co.data.Finish(co.data.Posts()[0].Handle)
	// No poll saw it in progress past the read deadline: the first look at
	// t0+32s finds it done, after ack + 30 s lease.
	r := co.poll(at(32 * time.Second))
	if len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.LateCompletion || co.c.Stats().LateCompletions != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestClose(t *testing.T) { // releases every handle, removes the peer, reports what it abandons
	co := newConsumer(t)
	co.data.QueueOutcomes(
		xfake.Outcome{Kind: xfake.Stuck},                    // R: reading, stoppable
		xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true}, // Q: quarantined, unstoppable
	)
	mustStart(t, co.c, "R", []int{1}, at(2*time.Second))
	mustStart(t, co.c, "Q", []int{2}, at(2*time.Second))
	mustStart(t, co.c, "W", []int{3}, at(time.Hour))
	co.c.Poll([][]byte{co.ok("R", 1), co.ok("Q", 2)}, at(time.Second))
	co.c.PeerDown(at(time.Second)) // R and Q read on; W retryable
	mustStart(t, co.c, "W2", []int{4}, at(time.Hour))
	if err := co.c.Close(); err != nil {
		t.Fatal(err)
	}
	var rep Results
	co.c.TakeResults(&rep)
	// W ended retryable at PeerDown, before Close; R (its READ stopped) and
	// W2 (waiting) end retryable at Close; Q's READ could not be stopped:
	// quarantined and settled at once, forced.
	if got := hashes(rep.retryable()); !slices.Equal(got, []string{"W", "R", "W2"}) {
		t.Fatalf("retryable %v", got)
	}
	if !slices.Equal(hashes(rep.quarantined()), []string{"Q"}) || !slices.Equal(hashes(rep.settled()), []string{"Q"}) || !rep.settled()[0].Forced {
		t.Fatalf("quarantined %v settled %+v", hashes(rep.quarantined()), rep.settled())
	}
	for _, o := range rep.retryable()[1:] {
		if o.Reason != xfer.Closed {
			t.Fatalf("%s ended %v, not closed", o.MMHash, o.Reason)
		}
	}
	for _, p := range co.data.Posts() {
		if co.data.Releases(p.Handle) != 1 {
			t.Fatalf("handle %d released %d times", p.Handle, co.data.Releases(p.Handle))
		}
	}
	co.data.CheckNoLeaks(t)
	rep.Reset()
	if err := co.c.Close(); err != nil {
		t.Fatal(err)
	}
	if co.c.TakeResults(&rep); rep.Len() != 0 {
		t.Fatal("second close reported something")
	}
	if err := co.c.StartXfer("X", nil, at(time.Hour), t0); !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("start after close: %v", err)
	}
	co.c.Poll([][]byte{co.ok("X")}, at(time.Hour)) // no panic, nothing
}

func TestResultsReuse(t *testing.T) {
	var r Results
	r.Completed = append(r.Completed, Outcome{MMHash: "x"})
	r.Released = append(r.Released, Outcome{})
	if r.Len() != 2 {
		t.Fatal(r.Len())
	}
	r.Reset()
	if r.Len() != 0 || cap(r.Completed) == 0 {
		t.Fatal("reset")
	}
}

// A data plane that no longer knows the producer's agent (nixl by default
// loads it after AddRemotePeer returns, and the load can fail) refuses the
// READ with xfer.ErrUnknownPeer: the session drops the registration and
// registers the producer again on its next ack, instead of failing every
// later fetch from it.
func TestUnknownPeerRegistersAgain(t *testing.T) {
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	co.data.SetPostError(fmt.Errorf("%w: its load failed", xfer.ErrUnknownPeer))
	r := co.poll(at(time.Second), co.ok("H", 3))
	if len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.PostFailed {
		t.Fatalf("results %+v", r)
	}
	if n := len(co.data.Leaks().Peers); n != 0 {
		t.Fatalf("%d peers still registered after the refusal", n)
	}
	co.data.SetPostError(nil)
	mustStart(t, co.c, "I", []int{1}, at(4*time.Second))
	r = co.poll(at(3*time.Second), co.ok("I", 4))
	if !slices.Equal(hashes(r.Completed), []string{"I"}) || co.c.Stats().Registrations != 2 {
		t.Fatalf("results %+v, %d registrations", r, co.c.Stats().Registrations)
	}
	// Any other refusal keeps the registration.
	mustStart(t, co.c, "J", []int{2}, at(6*time.Second))
	co.data.SetPostError(errors.New("busy"))
	co.poll(at(5*time.Second), co.ok("J", 5))
	if n := len(co.data.Leaks().Peers); n != 1 || co.c.Stats().Registrations != 2 {
		t.Fatalf("%d peers, %d registrations after another refusal", n, co.c.Stats().Registrations)
	}
}

// A consumer whose data plane takes shapes offers to in its requests and
// registers a producer from the shape when the ack has no descriptor (the
// fake refuses a shape that is not the producer's region); a descriptor,
// when there is one, is what registers. One whose plane does not take
// shapes never offers.
func TestRegistrationFromShape(t *testing.T) {
	fab := xfake.NewFabric()
	data, prod := fab.New("cons", 64, 16), fab.New("prod", 64, 16)
	out := &queue{}
	c := must(NewConsumerSession(ConsumerConfig{Logger: quiet}, out, data, compat))
	region, _, _ := wire.DecodeBlocks(prod.MemDescriptor())
	ack := func(h string, shape wire.Blocks, desc []byte) []byte {
		return encAck(wire.XferAck{MMHash: h, Status: wire.OK, SessionID: c.id, AgentMetadata: prod.AgentMetadata(),
			SrcBlockIndices: []wire.Int{wire.IntOf(2)}, Shape: shape, MemDescriptor: desc})
	}
	var r Results
	step := func(h string, a []byte) {
		r.Reset()
		mustStart(t, c, h, []int{1}, at(time.Hour))
		var req wire.XferReq
		if err := wire.DecodeReq(out.take()[0], &req); err != nil || !req.AcceptsShape {
			t.Fatalf("request: %v, %+v", err, req)
		}
		c.Poll([][]byte{a}, at(0))
		c.TakeResults(&r)
	}
	wrong := region
	wrong.Count--
	step("A", ack("A", wrong, nil))
	if len(r.tombstoned()) != 1 || r.tombstoned()[0].Reason != xfer.RegisterFailed || len(data.Leaks().Peers) != 0 {
		t.Fatalf("a wrong shape: %+v, peers %v", r, data.Leaks().Peers)
	}
	step("B", ack("B", wrong, prod.MemDescriptor()))
	if len(r.tombstoned()) != 0 || c.Stats().Registrations != 1 {
		t.Fatalf("a descriptor and a wrong shape: %+v, %d registrations", r, c.Stats().Registrations)
	}
	c2 := must(NewConsumerSession(ConsumerConfig{Logger: quiet}, out, fab.New("cons2", 64, 16), compat))
	mustStart(t, c2, "C", []int{1}, at(time.Hour))
	c3 := must(NewConsumerSession(ConsumerConfig{Logger: quiet}, out, plainData{fab.New("cons3", 64, 16)}, compat))
	mustStart(t, c3, "C", []int{1}, at(time.Hour))
	var req2, req3 wire.XferReq
	msgs := out.take()
	if wire.DecodeReq(msgs[0], &req2) != nil || wire.DecodeReq(msgs[1], &req3) != nil || !req2.AcceptsShape || req3.AcceptsShape {
		t.Fatalf("offers: %v, %v", req2.AcceptsShape, req3.AcceptsShape)
	}
	c2.Poll([][]byte{encAck(wire.XferAck{MMHash: "C", Status: wire.OK, SessionID: c2.id, AgentMetadata: prod.AgentMetadata(),
		SrcBlockIndices: []wire.Int{wire.IntOf(2)}, Shape: region})}, at(0))
	r.Reset()
	c2.TakeResults(&r)
	if len(r.tombstoned()) != 0 || c2.Stats().Registrations != 1 {
		t.Fatalf("the region's shape: %+v", r)
	}
}
