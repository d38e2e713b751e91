package xfertest

import "testing"

func TestFakeConformance(t *testing.T) {
	Conformance(t, func(t *testing.T) Pair {
		fab := NewFabric()
		c, p := fab.New("consumer", 128, 64), fab.New("producer", 128, 64)
		return Pair{Consumer: c, Producer: p, ConsumerBlock: c.Block, ProducerBlock: p.Block, Blocks: 128}
	})
}
