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
	return ackOK(h, co.c.ID(), co.prod.AgentMetadata(), ids...)
}

func (co *consumerOnly) poll(now time.Time, msgs ...[]byte) Results {
	co.c.Poll(msgs, now)
	var r Results
	co.c.TakeResults(&r)
	return r
}

func TestSessionID(t *testing.T) { // B32
	co := newConsumer(t)
	u, err := uuid.Parse(co.c.ID())
	if err != nil || u.Version() != 4 || u.String() != co.c.ID() {
		t.Fatalf("id %q: %v", co.c.ID(), err)
	}
	other := newConsumer(t)
	if other.c.ID() == co.c.ID() {
		t.Fatal("two sessions share an id")
	}
}

func TestStartXferSendsRequest(t *testing.T) { // B33
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1, 2}, at(2*time.Second))
	if len(co.out.msgs) != 1 {
		t.Fatalf("%d messages sent", len(co.out.msgs))
	}
	var req wire.XferReq
	if err := wire.DecodeReq(co.out.msgs[0], &req); err != nil {
		t.Fatal(err)
	}
	if req.MMHash != "H" || req.SessionID != co.c.ID() || req.CompatibilityHash != compat || req.Version() != wire.IntOf(2) {
		t.Fatalf("request %+v", req)
	}
	if !co.c.HasInFlight() || co.c.InFlight() != 1 {
		t.Fatal("not in flight")
	}
}

func TestStartXferSendFails(t *testing.T) { // B34
	co := newConsumer(t)
	co.out.err = errSend
	if err := co.c.StartXfer("H", []int{1}, t0, at(time.Second)); !errors.Is(err, errSend) {
		t.Fatalf("err %v", err)
	}
	if co.c.HasInFlight() {
		t.Fatal("a failed send left a transfer")
	}
	co.out.err = nil
	mustStart(t, co.c, "H", []int{1}, at(time.Second))
}

func TestStartXferBadBlocks(t *testing.T) {
	co := newConsumer(t)
	for _, blocks := range [][]int{{1, 1}, {3, -1}, {2, 5, 2}, {-1, 2}, {-3}} {
		if err := co.c.StartXfer("H", blocks, t0, at(time.Second)); !errors.Is(err, ErrBadBlocks) {
			t.Fatalf("%v: %v", blocks, err)
		}
	}
	if len(co.out.msgs) != 0 || co.c.HasInFlight() {
		t.Fatal("a refused start sent a request")
	}
}

func TestStartXferInFlight(t *testing.T) { // improvement 3
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	if err := co.c.StartXfer("H", []int{2}, t0, at(2*time.Second)); !errors.Is(err, ErrInFlight) {
		t.Fatalf("err %v", err)
	}
	// Also while its READ is quarantined.
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	co.poll(at(time.Second), co.ok("H", 3))
	co.c.PeerDown(at(2 * time.Second))
	if err := co.c.StartXfer("H", []int{2}, t0, at(3*time.Second)); !errors.Is(err, ErrInFlight) {
		t.Fatalf("quarantined: err %v", err)
	}
	if len(co.out.msgs) != 1 {
		t.Fatal("a refused start sent a request")
	}
}

func TestAckThenDoneInOnePoll(t *testing.T) { // B35, B44 (first registration)
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{4, 5}, at(2*time.Second))
	r := co.poll(at(time.Second), co.ok("H", 7, 8))
	if !slices.Equal(hashes(r.Completed), []string{"H"}) || len(r.Tombstoned) != 0 {
		t.Fatalf("results %+v", r)
	}
	if !slices.Equal(r.Completed[0].Blocks, []int{4, 5}) {
		t.Fatalf("blocks %v", r.Completed[0].Blocks)
	}
	if co.c.HasInFlight() || co.c.Stats().Registrations != 1 {
		t.Fatalf("in flight %v, registrations %d", co.c.HasInFlight(), co.c.Stats().Registrations)
	}
}

func TestNacks(t *testing.T) { // B36, B37
	for s := wire.NackMissing; s <= wire.NackNotReady; s++ {
		t.Run(s.String(), func(t *testing.T) {
			co := newConsumer(t)
			mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
			r := co.poll(at(time.Second), encAck(wire.XferAck{MMHash: "H", Status: s}))
			got := r.Tombstoned
			if s.Retryable() {
				got = r.Retryable
			}
			if r.Len() != 1 || len(got) != 1 || got[0].Status != s || got[0].Reason != xfer.Nacked {
				t.Fatalf("results %+v", r)
			}
			if co.c.HasInFlight() || len(co.data.Posts()) != 0 || co.c.Stats().Nacks[s] != 1 {
				t.Fatal("NACK left state behind")
			}
		})
	}
}

func TestAckTimeout(t *testing.T) { // B38, B39, B46
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	if r := co.poll(at(2 * time.Second)); r.Len() != 0 {
		t.Fatalf("at the deadline: %+v", r)
	}
	r := co.poll(at(3 * time.Second))
	if !slices.Equal(hashes(r.Retryable), []string{"H"}) || r.Retryable[0].Reason != xfer.AckTimedOut {
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
func TestPeerDown(t *testing.T) { // B40, B41, B47; reference weakness 3
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
	if !slices.Equal(hashes(r.Retryable), []string{"W"}) || r.Retryable[0].Reason != xfer.PeerDown {
		t.Fatalf("retryable %+v", r.Retryable)
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
	if !slices.Equal(hashes(r.Tombstoned), []string{"F"}) || r.Tombstoned[0].Reason != xfer.ReadError {
		t.Fatalf("tombstoned %+v", r)
	}
	// S outlives its deadline: quarantined, followed until it settles.
	r = co.poll(at(22 * time.Second))
	if !slices.Equal(hashes(r.Quarantined), []string{"S"}) || r.Quarantined[0].Reason != xfer.ReadTimedOut {
		t.Fatalf("quarantined %+v", r)
	}
	co.data.Finish(posts[2].Handle)
	r = co.poll(at(23 * time.Second))
	if len(r.Settled) != 1 || r.Settled[0].MMHash != "S" || r.Settled[0].Forced {
		t.Fatalf("settled %+v", r.Settled)
	}
	if co.c.HasInFlight() {
		t.Fatal("not cleaned up")
	}
	for _, p := range posts {
		if co.data.Releases(p.Handle) != 1 {
			t.Fatalf("handle %d released %d times", p.Handle, co.data.Releases(p.Handle))
		}
	}
}

func TestQuarantineSettlesInEveryPoll(t *testing.T) { // B47, improvement 4
	co := newConsumer(t)
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck, Unstoppable: true})
	mustStart(t, co.c, "H", []int{9}, at(2*time.Second))
	co.poll(at(time.Second), co.ok("H", 1))
	r := co.poll(at(22 * time.Second))
	if len(r.Quarantined) != 1 || r.Quarantined[0].Reason != xfer.ReadTimedOut {
		t.Fatalf("%+v", r)
	}
	r = co.poll(at(83 * time.Second))
	if len(r.Settled) != 1 || !r.Settled[0].Forced || r.Settled[0].Reason != xfer.QuarantineTimedOut {
		t.Fatalf("%+v", r)
	}
	if co.c.Stats().ForcedSettles != 1 {
		t.Fatal("forced settle not counted")
	}
}

func TestAckDispatchEdges(t *testing.T) { // B42, B43, improvements 1 and 2
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
	if !slices.Equal(hashes(r.Tombstoned), []string{"B", "C"}) || r.Tombstoned[0].Reason != xfer.BadAck {
		t.Fatalf("tombstoned %+v", r.Tombstoned)
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
	if !slices.Equal(hashes(r.Retryable), []string{"A"}) {
		t.Fatalf("%+v", r)
	}
}

func TestRegistration(t *testing.T) { // B44, B45
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
		c.Poll([][]byte{ackOK(h, c.ID(), meta, 2)}, now)
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
	if len(r.Tombstoned) != 1 || r.Tombstoned[0].Reason != xfer.RegisterFailed || len(data.Posts()) != posts {
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

func TestPostFailsTombstones(t *testing.T) { // improvement 1
	co := newConsumer(t)
	co.data.SetPostError(xfake.ErrInjected)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	r := co.poll(at(time.Second), co.ok("H", 1))
	if len(r.Tombstoned) != 1 || r.Tombstoned[0].Reason != xfer.PostFailed || co.c.HasInFlight() {
		t.Fatalf("%+v", r)
	}
}

func TestLateCompletion(t *testing.T) { // improvement 5
	co := newConsumer(t)
	mustStart(t, co.c, "H", []int{1}, at(2*time.Second))
	co.data.SetOutcome(xfake.Outcome{Kind: xfake.Stuck})
	co.poll(at(time.Second), co.ok("H", 1))
	co.data.Finish(co.data.Posts()[0].Handle)
	// No poll saw it in progress past the read deadline: the first look at
	// t0+32s finds it done, after ack + 30 s lease.
	r := co.poll(at(32 * time.Second))
	if len(r.Tombstoned) != 1 || r.Tombstoned[0].Reason != xfer.LateCompletion || co.c.Stats().LateCompletions != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestClose(t *testing.T) { // B49, improvement 6
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
	rep := co.c.Close()
	if len(rep.Pending.Retryable) != 1 || len(rep.Pending.Quarantined) != 0 {
		t.Fatalf("pending %+v", rep.Pending)
	}
	if !slices.Equal(hashes(rep.Freed), []string{"R", "W2"}) || !slices.Equal(hashes(rep.Unsafe), []string{"Q"}) {
		t.Fatalf("freed %v unsafe %v", hashes(rep.Freed), hashes(rep.Unsafe))
	}
	for _, p := range co.data.Posts() {
		if co.data.Releases(p.Handle) != 1 {
			t.Fatalf("handle %d released %d times", p.Handle, co.data.Releases(p.Handle))
		}
	}
	co.data.CheckNoLeaks(t)
	if again := co.c.Close(); len(again.Freed)+len(again.Unsafe)+again.Pending.Len() != 0 {
		t.Fatal("second close reported something")
	}
	if err := co.c.StartXfer("X", nil, t0, at(time.Hour)); !errors.Is(err, ErrClosed) {
		t.Fatalf("start after close: %v", err)
	}
	co.c.Poll([][]byte{co.ok("X")}, at(time.Hour)) // no panic, nothing
}

func TestResultsReuse(t *testing.T) {
	var r Results
	r.Completed = append(r.Completed, Outcome{MMHash: "x"})
	r.Settled = append(r.Settled, Outcome{})
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
	if len(r.Tombstoned) != 1 || r.Tombstoned[0].Reason != xfer.PostFailed {
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
		return encAck(wire.XferAck{MMHash: h, Status: wire.OK, SessionID: c.ID(), AgentMetadata: prod.AgentMetadata(),
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
	if len(r.Tombstoned) != 1 || r.Tombstoned[0].Reason != xfer.RegisterFailed || len(data.Leaks().Peers) != 0 {
		t.Fatalf("a wrong shape: %+v, peers %v", r, data.Leaks().Peers)
	}
	step("B", ack("B", wrong, prod.MemDescriptor()))
	if len(r.Tombstoned) != 0 || c.Stats().Registrations != 1 {
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
	c2.Poll([][]byte{encAck(wire.XferAck{MMHash: "C", Status: wire.OK, SessionID: c2.ID(), AgentMetadata: prod.AgentMetadata(),
		SrcBlockIndices: []wire.Int{wire.IntOf(2)}, Shape: region})}, at(0))
	r.Reset()
	c2.TakeResults(&r)
	if len(r.Tombstoned) != 0 || c2.Stats().Registrations != 1 {
		t.Fatalf("the region's shape: %+v", r)
	}
}
