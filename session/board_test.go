package session

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/xfer/xfertest"
)

// boardFake is a data plane with a grant board that records, for each
// call, the entry's pins and the replies sent so far.
type boardFake struct {
	*xfertest.Fake
	po      *producerOnly
	claimed bool
	live    map[uint64]bool
	events  []string
}

func (b *boardFake) ClaimGrantBoard() bool {
	if b.claimed {
		return false
	}
	b.claimed = true
	return true
}

func (b *boardFake) PublishGrant(id uint64) {
	b.live[id] = true
	b.events = append(b.events, fmt.Sprintf("publish %d pins %d replies %d", id, b.po.pins("R"), len(b.po.out.msgs)))
}

func (b *boardFake) RetireGrant(id uint64) {
	delete(b.live, id)
	b.events = append(b.events, fmt.Sprintf("retire %d pins %d", id, b.po.pins("R")))
}

func (b *boardFake) ReleaseGrantBoard() {
	b.claimed = false
	b.events = append(b.events, "release")
}

func (b *boardFake) take() []string { e := b.events; b.events = nil; return e }

// A producer publishes each grant before its ack leaves and retires it
// while its pin is still held, however the grant ends (notification,
// lease, Close); one session holds the board at a time.
func TestGrantBoardOrder(t *testing.T) {
	po := &producerOnly{cache: cache.NewEmbeddingCache(16), out: &queue{}}
	po.cache.Alloc("R", 2)
	po.cache.MarkReady("R")
	b := &boardFake{Fake: xfertest.New("prod", 16, 8), po: po, live: map[uint64]bool{}}
	po.data = b.Fake
	po.p = must(NewProducerSession(ProducerConfig{Logger: quiet, PinLease: 10 * time.Second}, b, po.cache, compat))
	if other, _ := NewProducerSession(ProducerConfig{Logger: quiet}, b, po.cache, compat); other.board != nil {
		t.Fatal("a second session over one data plane holds the board too")
	}
	check := func(what string, want ...string) {
		t.Helper()
		if got := b.take(); !slices.Equal(got, want) {
			t.Fatalf("%s: board calls %q, want %q", what, got, want)
		}
	}
	acks := po.poll(t, t0, req("R", sid("a")))
	check("grant", "publish 1 pins 1 replies 0")
	b.InjectNotif("", fmt.Appendf(nil, "%s:R#%d", sid("a"), acks[0].Grant))
	po.poll(t, at(time.Second))
	check("notification", "retire 1 pins 1")
	if po.pins("R") != 0 {
		t.Fatal("the notification did not unpin")
	}
	po.poll(t, at(2*time.Second), req("R", sid("b")))
	po.poll(t, at(13*time.Second))
	check("lease", "publish 2 pins 1 replies 0", "retire 2 pins 1")
	po.poll(t, at(14*time.Second), req("R", sid("c")))
	po.p.Close()
	check("close", "publish 3 pins 1 replies 0", "retire 3 pins 1", "release")
	if len(b.live) != 0 || po.pins("R") != 0 {
		t.Fatalf("live %v, pins %d", b.live, po.pins("R"))
	}
	if again := must(NewProducerSession(ProducerConfig{Logger: quiet}, b, po.cache, compat)); again.board == nil {
		t.Fatal("the board released by Close was not claimed again")
	}
}
