package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/internal/xfake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// goReq is a request as a Go consumer sends it: it names its attempt, and
// so takes a grant token.
func goReq(h, sid string, attempt uint64) []byte {
	return wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: sid, Attempt: attempt})
}

// A grant made for a Go consumer is a capability: only a READ or a
// notification that presents its token acts on it. A name, a grant id, or
// the bare key are not enough, whichever agent presents them.
func TestGrantTokenIsTheCapability(t *testing.T) {
	po := newProducer(t)
	a := sid("a")
	ack := po.poll(t, t0, goReq("R", a, 1))[0]
	if ack.Status != wire.OK || ack.Token.IsZero() || ack.Grant == 0 {
		t.Fatalf("ack %+v", ack)
	}
	e, _ := po.cache.Get("R")
	wrong := ack.Token
	wrong[3] ^= 1
	forged := [][]byte{
		[]byte(a + ":R"), // the key alone
		fmt.Appendf(nil, "%s:R#%d", a, ack.Grant),                                  // the id without its token
		wirext.AppendNotifGrant([]byte(a+":R"), ack.Grant, wrong),                  // a wrong token
		wirext.AppendNotifGrant([]byte(sid("b")+":R"), ack.Grant, ack.Token),       // another key
		wirext.AppendNotifGrant([]byte(a+":R"), ack.Grant+1, ack.Token),            // another id
		wirext.AppendNotifGrant([]byte(a+":R"), ack.Grant, wire.Token{15: 1}),      // a guess
		append(wirext.AppendNotifGrant([]byte(a+":R"), ack.Grant, ack.Token), 'x'), // not the token's form
	}
	for _, msg := range forged {
		if release, ok := po.p.authorizeRelease("cons", msg, e.Blocks); ok {
			release()
			t.Fatalf("READ with %q served", msg)
		}
		po.data.InjectNotif("cons", msg)
	}
	po.poll(t, at(time.Second))
	if po.pins("R") != 1 || po.p.Grants() != 1 || po.p.Stats().Completions != 0 {
		t.Fatalf("a forged notification acted: pins %d grants %d", po.pins("R"), po.p.Grants())
	}
	if st := po.p.Stats(); st.BadTokens < 4 {
		t.Fatalf("bad tokens counted %d", st.BadTokens)
	}
	good := wirext.AppendNotifGrant([]byte(a+":R"), ack.Grant, ack.Token)
	release, ok := po.p.authorizeRelease("cons", good, e.Blocks)
	if !ok {
		t.Fatal("the grantee's READ refused")
	}
	release()
	po.data.InjectNotif("cons", good)
	po.poll(t, at(2*time.Second))
	if po.pins("R") != 0 || po.p.Grants() != 0 || po.p.Stats().Completions != 1 {
		t.Fatalf("the grantee's notification: pins %d grants %d", po.pins("R"), po.p.Grants())
	}
}

// A request that names no attempt (vLLM's consumers) gets no token, and
// its grant is ended by the reference's notification, the bare key.
func TestGrantWithoutTokenForReferenceConsumers(t *testing.T) {
	po := newProducer(t)
	a := sid("a")
	ack := po.poll(t, t0, req("R", a))[0]
	if ack.Status != wire.OK || !ack.Token.IsZero() {
		t.Fatalf("ack %+v", ack)
	}
	po.data.InjectNotif("cons", []byte(a+":R"))
	po.poll(t, at(time.Second))
	if po.pins("R") != 0 || po.p.Stats().Completions != 1 {
		t.Fatalf("pins %d", po.pins("R"))
	}
}

// Grant ids never repeat across the producer sessions of a process, nor
// do tokens: a session that replaces another on the same data plane cannot
// make a notification or a READ of the old one act on its grants.
func TestGrantIDsAndTokensNeverRepeat(t *testing.T) {
	data := xfake.New("prod", 16, 8)
	c := cache.NewEmbeddingCache(16)
	if _, err := c.Alloc("R", 2); err != nil {
		t.Fatal(err)
	}
	c.MarkReady("R")
	seen := map[uint64]bool{}
	tokens := map[wire.Token]bool{}
	for range 3 {
		p := must(NewProducerSession(ProducerConfig{Logger: quiet}, data, c, compat))
		out := &queue{}
		for i := range 4 {
			p.Poll([]xfer.Message{{Identity: []byte("id"), Payload: goReq("R", sid(fmt.Sprint("s", i)), 1)}}, out, t0)
		}
		for _, raw := range out.take() {
			var ack wire.XferAck
			if err := wire.DecodeAck(raw, &ack); err != nil || ack.Status != wire.OK {
				t.Fatalf("%v %+v", err, ack)
			}
			if seen[ack.Grant] || tokens[ack.Token] {
				t.Fatalf("grant %d or its token seen before", ack.Grant)
			}
			seen[ack.Grant], tokens[ack.Token] = true, true
		}
		p.Close()
	}
}

// A consumer that names no agent is bound to the agent of its session's
// first notification: from then on another agent's READ is refused, under
// the grants made before too.
func TestAuthorizeFollowsTheSessionsBoundAgent(t *testing.T) {
	po := newProducer(t)
	a := sid("a")
	po.poll(t, t0, req("R", a), req("N2", a))
	po.poll(t, t0, req("R", a)) // a second grant of R, made before any notification
	e, _ := po.cache.Get("R")
	po.data.InjectNotif("cons", []byte(a+":R"))
	po.poll(t, at(time.Second)) // binds the session to "cons"; ends R's oldest grant
	if release, ok := po.p.authorizeRelease("thief", []byte(a+":R"), e.Blocks); ok {
		release()
		t.Fatal("another agent's READ served under a grant made before the session was bound")
	}
	release, ok := po.p.authorizeRelease("cons", []byte(a+":R"), e.Blocks)
	if !ok {
		t.Fatal("the bound agent's READ refused")
	}
	release()
}
