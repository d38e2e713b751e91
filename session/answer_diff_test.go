package session

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/fsm"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
)

// The matching of replies to requests written plainly, by linear scans,
// over a model of the unanswered requests: answer, named, ours and the
// bookkeeping of send and forgetSent, as the session once did them. The
// real session, which matches by lookups and counts, is driven with the
// same steps and must agree with it at every one.

type oldReq struct {
	mmHash  string
	attempt uint64
	sid     string // "" for the session's id
	expires time.Time
}

type oldModel struct {
	id      string
	sent    []oldReq
	perHash map[string]int
	ownSent map[string]struct{}
	echoes  bool
	replied bool
	gone    []oldReq // forgotten, for replies to answered requests
}

func (m *oldModel) send(h string, attempt uint64, sid string, expires time.Time) {
	r := oldReq{mmHash: h, attempt: attempt, expires: expires}
	if sid != m.id {
		r.sid = sid
		m.ownSent[sid] = struct{}{}
	}
	m.sent = append(m.sent, r)
	m.perHash[h]++
}

func (m *oldModel) forgetSent(n int) {
	for _, r := range m.sent[:n] {
		if r.sid != "" {
			delete(m.ownSent, r.sid)
		}
		if m.perHash[r.mmHash]--; m.perHash[r.mmHash] == 0 {
			delete(m.perHash, r.mmHash)
		}
	}
	m.gone = append(m.gone, m.sent[:n]...)
	m.sent = slices.Delete(m.sent, 0, n)
}

// answer is the old answer up to its forgetSent: the attempt answered, or 0.
func (m *oldModel) answer(mmHash, sid string, attempt uint64) uint64 {
	if m.perHash[mmHash] == 0 {
		return 0
	}
	q := m.sent
	i := 0
	switch {
	case attempt != 0:
		var found bool
		i, found = slices.BinarySearchFunc(q, attempt, func(r oldReq, a uint64) int {
			return int(min(max(int64(r.attempt)-int64(a), -1), 1))
		})
		if !found || q[i].mmHash != mmHash {
			return 0
		}
		m.echoes = true
	case len(sid) != 0:
		own := ""
		if sid != m.id {
			own = sid
		}
		for i < len(q) && (q[i].sid != own || q[i].mmHash != mmHash) {
			i++
		}
		if i == len(q) {
			return 0
		}
	default:
		for q[i].mmHash != mmHash {
			i++
		}
	}
	answered := q[i].attempt
	m.replied = true
	m.forgetSent(i + 1)
	return answered
}

// named is the old named; byHash is the real session's (unchanged code).
func (m *oldModel) named(c *ConsumerSession, sid, mmHash string) bool {
	if sid == "" {
		sid = m.id
	}
	if x := c.byHash[mmHash]; x != nil && !x.ended && x.SessionID() == sid {
		return true
	}
	for _, r := range m.sent {
		if r.mmHash == mmHash && (r.sid == sid || r.sid == "" && sid == m.id) {
			return true
		}
	}
	return false
}

func (m *oldModel) ours(sid string) bool {
	if sid == "" || sid == m.id {
		return true
	}
	_, ok := m.ownSent[sid]
	return ok
}

// expire is expire (unchanged) over the model.
func (m *oldModel) expire(c *ConsumerSession, now time.Time) {
	for len(m.sent) > 0 {
		r := m.sent[0]
		if !now.After(r.expires) || !c.echoes && r.sid == "" || r.attempt == c.contact.attempt && !c.contact.done {
			return
		}
		m.forgetSent(1)
	}
}

// checkState checks the session's bookkeeping against the model, and the
// invariants the new matching relies on.
func (m *oldModel) checkState(t testing.TB, c *ConsumerSession, step int) {
	t.Helper()
	q := c.sent[c.sentHead:]
	if len(q) != len(m.sent) {
		t.Fatalf("step %d: %d unanswered, model %d", step, len(q), len(m.sent))
	}
	want := map[string]pending{}
	own := map[string]uint64{}
	for i, r := range q {
		o := m.sent[i]
		if r.mmHash != o.mmHash || r.attempt != o.attempt || r.sid != o.sid || !r.expires.Equal(o.expires) {
			t.Fatalf("step %d: sent[%d] = %+v, model %+v", step, i, r, o)
		}
		if i > 0 && q[i-1].attempt >= r.attempt {
			t.Fatalf("step %d: attempts not increasing at %d: %d, %d", step, i, q[i-1].attempt, r.attempt)
		}
		p := want[r.mmHash]
		p.n++
		if r.sid == "" {
			p.sess++
		} else {
			own[r.sid] = r.attempt
		}
		want[r.mmHash] = p
	}
	if len(c.perHash) != len(want) {
		t.Fatalf("step %d: perHash %v, want %v", step, c.perHash, want)
	}
	for h, p := range want {
		if c.perHash[h] != p || m.perHash[h] != p.n {
			t.Fatalf("step %d: perHash[%q] = %+v (old %d), want %+v", step, h, c.perHash[h], m.perHash[h], p)
		}
	}
	if len(c.ownSent) != len(own) || len(m.ownSent) != len(own) {
		t.Fatalf("step %d: ownSent %v (old %d), want %v", step, c.ownSent, len(m.ownSent), own)
	}
	for s, a := range own {
		if got, ok := c.ownSent[s]; !ok || got != a {
			t.Fatalf("step %d: ownSent[%s] = %d, %v; want %d", step, s, got, ok, a)
		}
	}
	for i := range c.sent[:c.sentHead] {
		if c.sent[i] != (request{}) {
			t.Fatalf("step %d: forgotten sent[%d] not cleared", step, i)
		}
	}
	if c.echoes != m.echoes || c.replied != m.replied {
		t.Fatalf("step %d: echoes %v replied %v, old %v %v", step, c.echoes, c.replied, m.echoes, m.replied)
	}
}

// chooser draws the steps: from a PRNG, or from fuzz input.
type chooser interface{ intn(n int) int }

type prng struct{ r *rand.Rand }

func (p prng) intn(n int) int { return p.r.IntN(n) }

type bytesSrc struct{ b []byte }

func (s *bytesSrc) intn(n int) int {
	if len(s.b) == 0 {
		return 0
	}
	v := int(s.b[0])
	s.b = s.b[1:]
	return v % n
}

func (s *bytesSrc) done() bool { return len(s.b) == 0 }

// runAnswerDiff runs steps drawn from ch against the session and the old
// model, comparing answer, named, StartXfer's refusals and the state after
// every step.
func runAnswerDiff(t testing.TB, ch chooser, steps int, seed byte, more func() bool) {
	fab := xfake.NewFabric()
	data := fab.New("cons", 64, 16)
	c := must(NewConsumerSession(ConsumerConfig{Logger: quiet, Rand: newSeeded(seed)}, &queue{}, data, compat))
	m := &oldModel{id: c.id, perHash: map[string]int{}, ownSent: map[string]struct{}{}}
	hashes := []string{"a", "b", "c", "d", wirext.ContactHash}
	now := t0
	deadline := func() time.Time { return now.Add(time.Duration(ch.intn(8)) * time.Second) }
	pickHash := func() string {
		if ch.intn(16) == 0 {
			return "zz" // never sent
		}
		return hashes[ch.intn(len(hashes))]
	}
	pickReq := func() (oldReq, bool) {
		switch {
		case len(m.sent) > 0 && ch.intn(4) != 0:
			return m.sent[ch.intn(len(m.sent))], true
		case len(m.gone) > 0:
			return m.gone[len(m.gone)-1-ch.intn(min(len(m.gone), 32))], true
		}
		return oldReq{}, false
	}
	pickSid := func(h string) string {
		switch ch.intn(6) {
		case 0:
			return ""
		case 1:
			return c.id
		case 2:
			return "00000000-0000-4000-8000-000000000000" // no request's
		default: // some request's own id (of h where one has it), answered or not
			for _, r := range m.sent {
				if r.mmHash == h && r.sid != "" && ch.intn(2) == 0 {
					return r.sid
				}
			}
			if r, ok := pickReq(); ok && r.sid != "" {
				return r.sid
			}
			return c.id
		}
	}
	pickAttempt := func() uint64 {
		switch ch.intn(4) {
		case 0, 1:
			return 0
		case 2:
			if r, ok := pickReq(); ok {
				return r.attempt
			}
		}
		return 1 << 62 // no request's
	}
	sendOne := func(h string, contact bool) {
		e := deadline()
		var a uint64
		var sid string
		var err error
		if contact {
			refuse := m.perHash[h] >= maxUnansweredPerHash
			if err = c.sendContact(e, now); (err != nil) != refuse {
				t.Fatalf("sendContact = %v, old would refuse: %v", err, refuse)
			} else if err != nil {
				return
			}
			a, sid = c.contact.attempt, c.id
		} else {
			a, sid, err = c.send(h, false, e)
		}
		if err != nil {
			t.Fatal(err)
		}
		m.send(h, a, sid, e)
	}
	for step := 0; step < steps && more(); step++ {
		switch op := ch.intn(20); {
		case op < 3: // StartXfer: refused as the old count refused
			h := hashes[ch.intn(len(hashes)-1)]
			if _, busy := c.byHash[h]; busy {
				c.Cancel(h, now) // an error if it ended already
				if ch.intn(2) == 0 {
					c.Poll(nil, now) // drop ended transfers
					m.expire(c, now)
				}
				break
			}
			refuse := m.perHash[h] >= maxUnansweredPerHash
			e := deadline()
			err := c.StartXfer(h, nil, e, now)
			if (err != nil) != refuse {
				t.Fatalf("step %d: StartXfer(%s) = %v, old would refuse: %v", step, h, err, refuse)
			}
			if err == nil {
				x := c.byHash[h]
				m.send(h, x.attempt, x.SessionID(), e)
			}
		case op < 6: // a request whose transfer is gone (a retry's earlier try)
			h := hashes[ch.intn(len(hashes))]
			sendOne(h, h == wirext.ContactHash && ch.intn(2) == 0)
		case op == 6:
			c.ownIDs = !c.ownIDs
		case op < 12: // a reply, straight to answer
			h := pickHash()
			sid, a := pickSid(h), pickAttempt()
			x, got := c.answer([]byte(h), []byte(sid), a)
			want := m.answer(h, sid, a)
			if got != want {
				t.Fatalf("step %d: answer(%q, %q, %d) = %d, old %d", step, h, sid, a, got, want)
			}
			var wx *cxfer
			if y := c.byHash[h]; want != 0 && y != nil && y.attempt == want && y.State() == fsm.WaitingAck {
				wx = y
			}
			if x != wx {
				t.Fatalf("step %d: answer(%q, %q, %d) transfer %p, old %p", step, h, sid, a, x, wx)
			}
		case op < 14: // a NACK through Poll: ours, answer, fail, advance, expire
			h := pickHash()
			sid, a := pickSid(h), pickAttempt()
			if ch.intn(2) == 0 {
				now = now.Add(time.Duration(ch.intn(3)) * time.Second)
			}
			ack := wire.AppendAck(nil, &wire.XferAck{MMHash: h, Status: wire.NackMissing, SessionID: sid, Attempt: a})
			if m.ours(sid) {
				m.answer(h, sid, a)
			}
			c.Poll([][]byte{ack}, now)
			m.expire(c, now)
			var r Results
			c.TakeResults(&r)
		case op < 17: // named
			h := pickHash()
			sid := pickSid(h)
			if got, want := c.named(sid, h), m.named(c, sid, h); got != want {
				t.Fatalf("step %d: named(%q, %q) = %v, old %v", step, sid, h, got, want)
			}
		case op == 17: // time passes: expiry
			now = now.Add(time.Duration(ch.intn(4)) * time.Second)
			c.echoes = c.echoes || ch.intn(4) == 0
			m.echoes = c.echoes
			c.Poll(nil, now)
			m.expire(c, now)
		case op == 18:
			if ch.intn(4) == 0 {
				c.PeerDown(now)
				m.forgetSent(len(m.sent))
			} else {
				c.trim()
			}
		default: // a burst, so that trim's shrink.Map copies the maps
			if ch.intn(8) != 0 {
				break
			}
			own := c.ownIDs
			c.ownIDs = ch.intn(2) == 0
			for range 300 + ch.intn(100) {
				sendOne(hashes[ch.intn(len(hashes)-1)], false)
			}
			c.ownIDs = own
		}
		m.checkState(t, c, step)
	}
}

func TestAnswerMatchesOldScan(t *testing.T) {
	iters := 100
	if testing.Short() {
		iters = 20
	}
	for seed := range iters {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runAnswerDiff(t, prng{rand.New(rand.NewPCG(uint64(seed), 7))}, 3000, byte(seed), func() bool { return true })
		})
	}
}

func FuzzAnswerMatchesOldScan(f *testing.F) {
	f.Add([]byte{0, 7, 3, 9, 1, 12, 4, 0, 15, 2, 8, 1, 3, 17, 5, 13, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &bytesSrc{b: b}
		runAnswerDiff(t, s, 1<<20, 1, func() bool { return !s.done() })
	})
}
