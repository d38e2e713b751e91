package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/xfer"
)

// Whatever a consumer sends a Server, after the greeting or in place of
// it, the server never panics, and a request that passes its checks is
// delivered whole; what it counts for Drain goes back to zero.
func FuzzServerInbound(f *testing.F) {
	f.Add(true, envelope("hello"))
	f.Add(true, append(envelope("a"), envelope("b")...))
	f.Add(true, []byte{flagMore, 0, flagLong, 0, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add(true, []byte{flagCommand, 5, 4, 'P', 'I', 'N', 'G'})
	f.Add(true, readyCommand())
	f.Add(true, []byte{flagMore, 0, flagMore, 0, flagMore, 0, 0, 1, 'x'})
	f.Add(false, zmtpGreeting)
	f.Add(false, append(append([]byte(nil), zmtpGreeting...), readyWithIdentity("x")...))
	s := newServer(f, ServerConfig{MaxFrame: 1 << 10, MaxQueuedBytes: 4 << 10, HandshakeTimeout: 200 * time.Millisecond})
	addr := s.Addr().String()
	f.Fuzz(func(t *testing.T, handshake bool, data []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Skip(err)
		}
		defer c.Close()
		if handshake {
			if err := zmtpHello(c, readyCommand()); err != nil {
				t.Fatalf("handshake: %v", err)
			}
		}
		c.Write(data)
		c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		io.Copy(io.Discard, c) // until it closes or stays quiet
		c.Close()
		for range 100 {
			s.Drain(nil)
			if s.inBytes.Load() == 0 {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		if n := s.inBytes.Load(); n < 0 || n > 4<<10+1<<10+64 {
			t.Fatalf("%d bytes counted for Drain", n)
		}
	})
}

// Whatever a consumer sends a producer's data port, the producer never
// panics; the connection closes or waits within its timeouts.
func FuzzDataPortInbound(f *testing.F) {
	hello := appendHello(nil, "fz", 0, nil)
	f.Add(hello)
	f.Add(append(hello, appendRead(nil, 1, []byte("a:b"), 1, spans(nil, []int{0}), false)...))
	f.Add(append(hello, appendRead(nil, 1, []byte("a:b"), 2, spans(nil, []int{6, 7}), true)...))
	f.Add(append(append(hello, appendRead(nil, 1, []byte("a:b"), 1, spans(nil, []int{0}), false)...), appendHead(nil, frameDone)...))
	f.Add(append(hello, append(appendHead(nil, frameNotify), 0, 3, 'a', ':', 'b')...))
	f.Add(appendHello(nil, "fz", 1<<20, make([]byte, challengeLen)))
	pr := newRegion(f, 8, 64)
	p := newTCP(f, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll, IOTimeout: 50 * time.Millisecond, HelloTimeout: 50 * time.Millisecond})
	addr := p.Addr().String()
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Skip(err)
		}
		defer c.Close()
		c.Write(data)
		c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		io.Copy(io.Discard, c)
		p.DrainNotifs(nil)
	})
}

// readIDMark stands in a fuzzed producer's stream for the id of the
// consumer's READ, which dataProducerScript puts in its place.
var readIDMark = bytes.Repeat([]byte{0xee}, 8)

// Whatever a producer answers a READ with, the consumer never panics, the
// READ ends (completed only with every byte it asked for), Release then
// succeeds, and nothing is written outside the READ's own block.
func FuzzLinkInbound(f *testing.F) { fuzzLink(f, false) }

// The same, the consumer stepping: its Steps read the link (see linkConn).
func FuzzHotLinkInbound(f *testing.F) { fuzzLink(f, true) }

func fuzzLink(f *testing.F, stepped bool) {
	const bs = 64
	welcome := appendWelcome(nil, nil)
	good := append(appendDataHead(append([]byte(nil), welcome...), 0, dataOK, bs), bytes.Repeat([]byte{'d'}, bs)...)
	copy(good[len(welcome)+headLen:], readIDMark)
	f.Add(good)
	f.Add(good[:len(good)-10])
	f.Add(append(append([]byte(nil), good...), good[len(welcome):]...))
	refused := appendDataHead(append([]byte(nil), welcome...), 0, dataRefused, 0)
	copy(refused[len(welcome)+headLen:], readIDMark)
	f.Add(refused)
	pushed := appendDataHead(append([]byte(nil), welcome...), 0, dataPushed, 0)
	copy(pushed[len(welcome)+headLen:], readIDMark)
	f.Add(pushed)
	push := append(appendPushHead(append([]byte(nil), welcome...), []byte("a:b"), bs, []int{0}), bytes.Repeat([]byte{'p'}, bs)...)
	f.Add(append(push, pushed[len(welcome):]...))
	f.Add(welcome)
	f.Add([]byte("nonsense"))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	stream := make(chan []byte, 1)
	served := make(chan struct{})
	go func() { scripted(ln, stream, dataProducerScript); close(served) }()
	f.Cleanup(func() { ln.Close(); <-served })
	meta := agentMetaBytes(f, "fz", ln.Addr().String(), bs, 4, metaVersion)
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newRegion(t, 4, bs)
		for i := range 4 {
			copy(r.Block(i), bytes.Repeat([]byte{byte('0' + i)}, bs))
		}
		c := newTCP(t, r, TCPConfig{IOTimeout: 100 * time.Millisecond, HelloTimeout: 100 * time.Millisecond, Conns: 1})
		peer, err := c.AddRemotePeer(meta, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-stream: // left by an iteration that never dialed
		default:
		}
		stream <- data
		if stepped {
			// Its goroutine hands the link over after the welcome, which
			// a script that starts with one sends before the READ's
			// answer: that answer is a Step's.
			for range 3 {
				tcpPlane{c}.Step()
			}
			if err := (tcpPlane{c}).Contact(context.Background(), peer.Agent, plane.Contact{}); err != nil {
				return // no welcome: FuzzLinkInbound's
			}
			for i := 0; i < 1000 && linkOf(c, peer.Agent) != nil && !linkOf(c, peer.Agent).hot.Load(); i++ {
				tcpPlane{c}.Step()
			}
		}
		h, err := c.PostRead([]int{2}, peer.Agent, []int{0}, []byte("a:b"))
		if err != nil {
			return
		}
		var pr xfer.Progress
		if stepped {
			pr = stepUntilEnd(t, c, h)
		} else {
			pr = waitEnd(t, c, h)
		}
		if err := c.Release(h); err != nil {
			t.Fatalf("Release after %v: %v", pr, err)
		}
		for i := range 4 {
			if i != 2 && !bytes.Equal(r.Block(i), bytes.Repeat([]byte{byte('0' + i)}, bs)) {
				t.Fatalf("block %d, not the READ's, was written: %q", i, r.Block(i))
			}
		}
		if pr == xfer.Complete && bytes.Equal(r.Block(2), bytes.Repeat([]byte{'2'}, bs)) {
			t.Fatalf("READ complete with its block untouched")
		}
		c.Close()
	})
}

// scripted answers each connection ln accepts with the next script from
// scripts, through answer (then it closes the connection); one given none
// within a second is closed. It returns once ln is closed.
func scripted(ln net.Listener, scripts chan []byte, answer func(c net.Conn, script []byte)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		var script []byte
		select {
		case script = <-scripts:
		case <-time.After(time.Second):
			c.Close()
			continue
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			answer(c, script)
			io.Copy(io.Discard, c)
		}()
	}
}

// dataProducerScript plays a producer's data port: after the consumer's
// hello and first READ, data, with readIDMark replaced by the READ's id.
func dataProducerScript(c net.Conn, data []byte) {
	var hdr [headLen + 2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	io.ReadFull(c, make([]byte, int(binary.BigEndian.Uint16(hdr[headLen:]))+4+challengeLen))
	var rd [headLen + 14]byte
	id := make([]byte, 8)
	// The welcome may come first in data: the READ follows it.
	if bytes.HasPrefix(data, []byte(frameMagic+string(rune(frameWelcome)))) && len(data) >= headLen+proofLen {
		c.Write(data[:headLen+proofLen])
		data = data[headLen+proofLen:]
		if _, err := io.ReadFull(c, rd[:]); err == nil {
			copy(id, rd[headLen:headLen+8])
		}
	}
	c.Write(bytes.ReplaceAll(data, readIDMark, id))
}

// Whatever a producer sends a Client, after the greeting or in place of
// it, the client never panics, and every payload Drain hands out came
// whole.
func FuzzClientInbound(f *testing.F) {
	router := readyProps("Socket-Type", "ROUTER")
	f.Add(true, envelope("ack"))
	f.Add(true, append(envelope("a"), envelope("b")...))
	f.Add(true, []byte{flagMore, 0, flagLong, 0, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add(true, []byte{flagCommand, 5, 4, 'P', 'I', 'N', 'G'})
	f.Add(true, router)
	f.Add(false, zmtpGreeting)
	f.Add(false, append(append([]byte(nil), zmtpGreeting...), router...))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	stream := make(chan []byte, 1)
	served := make(chan struct{})
	go func() {
		defer close(served)
		scripted(ln, stream, func(c net.Conn, data []byte) {
			if data[0] == 1 {
				c.Write(zmtpGreeting)
				io.ReadFull(c, make([]byte, greetingLen))
				c.Write(router)
			}
			c.Write(data[1:])
		})
	}()
	f.Cleanup(func() { ln.Close(); <-served })
	ep := "tcp://" + ln.Addr().String()
	f.Fuzz(func(t *testing.T, handshake bool, data []byte) {
		select {
		case <-stream:
		default:
		}
		b := byte(0)
		if handshake {
			b = 1
		}
		stream <- append([]byte{b}, data...)
		cl := NewClient(ClientConfig{Logger: quiet, HandshakeTimeout: 100 * time.Millisecond, PeerTimeout: 200 * time.Millisecond, MaxFrame: 1 << 10})
		defer cl.Close()
		cl.Send(ep, []byte("req"))
		for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
			cl.Drain(nil)
			cl.Dead(nil)
		}
	})
}
