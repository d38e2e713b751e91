package transport

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// stallingProducer is a raw data-plane producer: it answers the first READ
// with its header and half of its bytes, signals, and sends the rest only
// when told to.
type stallingProducer struct {
	ln      net.Listener
	halfway chan struct{}
	rest    chan struct{}
}

func newStallingProducer(t *testing.T, bs int) *stallingProducer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sp := &stallingProducer{ln: ln, halfway: make(chan struct{}), rest: make(chan struct{})}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [headLen + 2]byte
		io.ReadFull(c, hdr[:])
		io.ReadFull(c, make([]byte, int(binary.BigEndian.Uint16(hdr[headLen:]))+4+challengeLen))
		c.Write(appendWelcome(nil, nil))
		var rd [headLen + 14]byte
		if _, err := io.ReadFull(c, rd[:]); err != nil {
			return
		}
		id := binary.BigEndian.Uint64(rd[headLen:])
		nl, nb := binary.BigEndian.Uint16(rd[headLen+8:]), binary.BigEndian.Uint32(rd[headLen+10:])
		io.ReadFull(c, make([]byte, int(nl)+4*int(nb)))
		c.Write(appendDataHead(nil, id, dataOK, uint64(bs)))
		c.Write(bytes.Repeat([]byte("A"), bs/2))
		close(sp.halfway)
		<-sp.rest
		c.Write(bytes.Repeat([]byte("B"), bs/2)) // must not land
		io.Copy(io.Discard, c)
	}()
	return sp
}

func (sp *stallingProducer) meta(t *testing.T, bs, blocks int) []byte {
	return agentMetaBytes(t, "stall", sp.ln.Addr().String(), bs, blocks, metaVersion)
}

// Releasing a READ whose bytes are landing stops it for certain: Release returns nil only once nothing more can be written, and
// the bytes sent after it never land.
func TestTCPReleaseStopsALandingRead(t *testing.T) {
	const bs = 64 << 10
	cr := newRegion(t, 4, bs)
	c := newTCP(t, cr, TCPConfig{})
	sp := newStallingProducer(t, bs)
	peer, err := c.AddRemotePeer(sp.meta(t, bs, 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.PostRead([]int{1}, peer.Agent, []int{0}, []byte("s:h"))
	if err != nil {
		t.Fatal(err)
	}
	<-sp.halfway
	c.mu.Lock()
	op := c.handles[h]
	c.mu.Unlock()
	for op.state.Load() != opWriting {
		time.Sleep(100 * time.Microsecond) // the reader reaches the bytes
	}
	if err := c.Release(h); err != nil {
		t.Fatalf("Release of a landing READ: %v", err)
	}
	snapshot := bytes.Clone(cr.Block(1))
	close(sp.rest)
	time.Sleep(50 * time.Millisecond) // give stray bytes every chance to land
	if !bytes.Equal(cr.Block(1), snapshot) || bytes.Contains(cr.Block(1), []byte("B")) {
		t.Fatal("bytes landed after Release returned")
	}
}

// A READ posted late in an idle period gets its whole IOTimeout, not what
// is left of the reader's wait.
func TestTCPReadDeadlineStartsAtPost(t *testing.T) {
	const timeout = 400 * time.Millisecond
	cr, pr := newRegion(t, 4, 64), newRegion(t, 4, 64)
	slow := make(chan struct{}, 1)
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: func(string, []byte, []int) (func(), bool) {
		select {
		case <-slow:
			time.Sleep(timeout / 2) // a producer busy for half the timeout
		default:
		}
		return func() {}, true
	}})
	c := newTCP(t, cr, TCPConfig{IOTimeout: timeout})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Connect both links; the readers start waiting now.
	for i := range 2 {
		h, _ := c.PostRead([]int{i}, peer.Agent, []int{i}, []byte("s:h"))
		if waitEnd(t, c, h) != xfer.Complete {
			t.Fatal("first READs failed")
		}
		c.Release(h)
	}
	time.Sleep(timeout * 3 / 4) // idle: the readers' waits are mostly spent
	slow <- struct{}{}
	h, _ := c.PostRead([]int{2}, peer.Agent, []int{2}, []byte("s:h"))
	if got := waitEnd(t, c, h); got != xfer.Complete {
		t.Fatalf("a READ posted late in an idle period: %s", got)
	}
}
