package xfake

import (
	"errors"
	"testing"

	"github.com/ecxfer/ecxfer/xfer"
)

// READs the fake fails for causes of its own (the producer's authorizer
// refused it; the producer closed) say so, not "injected failure".
func TestFakeSaysWhyAReadFailed(t *testing.T) {
	for _, tc := range []string{"refused", "producer closed"} {
		fab := NewFabric()
		c, p := fab.New("consumer", 4, 8), fab.New("producer", 4, 8)
		if tc == "refused" {
			p.SetAuthorizer(func(string, []byte, []int) (func(), bool) { return nil, false })
		}
		peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		h, err := c.PostRead([]int{0}, peer.Agent, []int{1}, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if tc == "producer closed" {
			p.Close()
		}
		pg, _ := c.Check(h)
		why := c.FailedWhy(h)
		if pg != xfer.Failed || why == nil || errors.Is(why, ErrInjected) {
			t.Errorf("%s: nothing was injected, yet the why is %v", tc, why)
		}
	}
}
