package connector_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The floor anchors of BenchmarkEngine: a fetch's three messages (request,
// answer, completion notification, floorMsg bytes each) between the same
// two engines, with no library at all, read in one of three ways:
//
//   - polled: the engine's loop reads a descriptor outside the runtime's
//     network poller once per step, without waiting; a message arriving
//     wakes no thread;
//   - registered: the same, on a descriptor the runtime's poller still
//     watches (the net.Conn stays open) though no goroutine waits on it:
//     what reading a library's sockets in its Step, and no more, buys;
//   - netpoller: a goroutine per connection waits in the runtime's poller,
//     as the library's sockets do, and hands whole messages to the loop;
//   - polled-bytes: polled, the answer carrying the fetch's bytes, read
//     straight into a buffer of the consumer's: the floor of a fetch whose
//     bytes cross TCP, as over the TCP plane.
//
// What a fetch costs beyond the first is the price of I/O that wakes a
// thread for each message, on this machine.

// floorMode is how a floor connection is read.
type floorMode int

const (
	floorPolled floorMode = iota
	floorRegistered
	floorNetpoller
	floorPolledBytes
	floorModes
)

var floorNames = [floorModes]string{"floor-polled", "floor-registered", "floor-netpoller", "floor-polled-bytes"}

// floorMsg is the size of each floor message, about a request's, an
// answer's and a notification's on the wire.
const floorMsg = 200

// Message kinds, the first byte of a floor message.
const (
	floorRequest byte = 1 + iota
	floorAnswer
	floorDone
)

// floorConn is one end of a floor connection.
type floorConn struct {
	fd   int      // polled, registered: a descriptor of our own, non-blocking
	c    net.Conn // netpoller
	keep net.Conn // registered: the conn, open, its descriptor in the poller
	in   []byte   // polled: bytes read, the start of a message (in inb)
	inb  [floorMsg]byte
	out  [floorMsg]byte
	// polled-bytes: the answer's bytes, the producer's source or the
	// consumer's destination (recv), and what is left of them to read.
	payload []byte
	recv    bool
	left    int

	mu    sync.Mutex // netpoller: the reader's
	kinds []byte
	err   error
}

// newFloorConn takes c over. Polled, its descriptor leaves the runtime's
// poller: a duplicate is kept and c is closed (which removes it from the
// poller's set; the socket lives on in the duplicate). Registered, c stays
// open beside the duplicate, and in the poller's set.
func newFloorConn(c net.Conn, mode floorMode) (*floorConn, error) {
	f := &floorConn{c: c, fd: -1}
	if mode == floorNetpoller {
		go f.read()
		return f, nil
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	var derr error
	if err := raw.Control(func(s uintptr) { f.fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if mode == floorRegistered {
		f.keep = c
	} else {
		if mode == floorPolledBytes {
			tc := c.(*net.TCPConn) // as the TCP plane's connections
			tc.SetReadBuffer(4 << 20)
			tc.SetWriteBuffer(4 << 20)
		}
		c.Close()
	}
	f.c = nil
	if derr == nil {
		derr = unix.SetNonblock(f.fd, true)
	}
	return f, derr
}

// read is the netpoller's reader goroutine.
func (f *floorConn) read() {
	var msg [floorMsg]byte
	for {
		_, err := io.ReadFull(f.c, msg[:])
		f.mu.Lock()
		if err != nil {
			f.err = err
			f.mu.Unlock()
			return
		}
		f.kinds = append(f.kinds, msg[0])
		f.mu.Unlock()
	}
}

// send writes a message of kind; polled, it retries a full socket at once
// (200 bytes on a connection with one fetch in flight never fill it).
func (f *floorConn) send(kind byte) error {
	f.out[0] = kind
	if f.c != nil {
		_, err := f.c.Write(f.out[:])
		return err
	}
	bufs := [][]byte{f.out[:]}
	if kind == floorAnswer && !f.recv && f.payload != nil {
		bufs = append(bufs, f.payload)
	}
	for len(bufs) > 0 {
		n, err := unix.Writev(f.fd, bufs)
		if err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return err
		}
		for n = max(n, 0); len(bufs) > 0 && n >= len(bufs[0]); bufs = bufs[1:] {
			n -= len(bufs[0])
		}
		if n > 0 {
			bufs[0] = bufs[0][n:]
		}
	}
	return nil
}

// pollBytes is poll for a consumer's polled-bytes connection: each
// answer's bytes are read straight into the payload buffer.
func (f *floorConn) pollBytes(kinds []byte) ([]byte, error) {
	for {
		into := f.inb[len(f.in):]
		if f.left > 0 {
			into = f.payload[len(f.payload)-f.left:]
		}
		n, err := unix.Read(f.fd, into)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return kinds, nil
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return kinds, err
		case n == 0:
			return kinds, io.EOF
		}
		if f.left > 0 {
			if f.left -= n; f.left == 0 {
				kinds = append(kinds, floorAnswer)
			}
			continue
		}
		if f.in = f.inb[:len(f.in)+n]; len(f.in) < floorMsg {
			continue
		}
		if kind := f.in[0]; kind == floorAnswer {
			f.left = len(f.payload)
		} else {
			kinds = append(kinds, kind)
		}
		f.in = f.inb[:0]
	}
}

// poll appends the kinds of the messages that arrived since the last call
// to kinds, without waiting.
func (f *floorConn) poll(kinds []byte) ([]byte, error) {
	if f.c != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		kinds = append(kinds, f.kinds...)
		f.kinds = f.kinds[:0]
		return kinds, f.err
	}
	if f.recv {
		return f.pollBytes(kinds)
	}
	var buf [16 * floorMsg]byte
	for {
		n, err := unix.Read(f.fd, buf[:])
		switch {
		case errors.Is(err, unix.EAGAIN):
			return kinds, nil
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return kinds, err
		case n == 0:
			return kinds, io.EOF
		}
		for b := buf[:n]; len(b) > 0; {
			k := copy(f.inb[len(f.in):], b)
			f.in = f.inb[:len(f.in)+k]
			b = b[k:]
			if len(f.in) == floorMsg {
				kinds = append(kinds, f.in[0])
				f.in = f.inb[:0]
			}
		}
		if n < len(buf) {
			return kinds, nil
		}
	}
}

func (f *floorConn) close() {
	if f.c != nil {
		f.c.Close()
		return
	}
	if f.keep != nil {
		f.keep.Close()
	}
	unix.Close(f.fd)
}

// floorServer is the producer process's end: it answers each request once
// per engine step, as a Producer's Step would.
type floorServer struct {
	lns   [floorModes]net.Listener
	mu    sync.Mutex
	conns []*floorConn
	kinds []byte
}

// newFloorServer starts the floor servers; a polled-bytes answer carries
// payload bytes.
func newFloorServer(payload int) *floorServer {
	s := &floorServer{}
	src := make([]byte, payload)
	for i := range src {
		src[i] = byte(i)
	}
	for i := range s.lns {
		s.lns[i] = must(net.Listen("tcp", "127.0.0.1:0"))
		go func() {
			for {
				c, err := s.lns[i].Accept()
				if err != nil {
					return
				}
				f, err := newFloorConn(c, floorMode(i))
				if err != nil {
					c.Close()
					continue
				}
				if floorMode(i) == floorPolledBytes {
					f.payload = src
				}
				s.mu.Lock()
				s.conns = append(s.conns, f)
				s.mu.Unlock()
			}
		}()
	}
	return s
}

// addrs returns the servers' addresses, one per mode, space-separated.
func (s *floorServer) addrs() string {
	var a []string
	for _, ln := range s.lns {
		a = append(a, ln.Addr().String())
	}
	return strings.Join(a, " ")
}

// step answers the requests that arrived.
func (s *floorServer) step() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < len(s.conns); i++ {
		f := s.conns[i]
		var err error
		s.kinds, err = f.poll(s.kinds[:0])
		for _, k := range s.kinds {
			if k == floorRequest && err == nil {
				err = f.send(floorAnswer)
			}
		}
		if err != nil {
			f.close()
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			i--
		}
	}
}

func (s *floorServer) close() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.conns {
		f.close()
	}
	s.conns = nil
}

// floorLoad is the consumer's end, an engineLoad: a fetch is a request,
// its answer, and the notification sent on the answer.
type floorLoad struct {
	name  string
	b     *testing.B
	f     *floorConn
	dues  []time.Time // of the fetches asked for, in order
	kinds []byte
}

func (l *floorLoad) ask(due, _ time.Time) bool {
	if err := l.f.send(floorRequest); err != nil {
		l.b.Fatal(err)
	}
	l.dues = append(l.dues, due)
	return true
}

func (l *floorLoad) step(time.Time) []time.Time {
	var err error
	if l.kinds, err = l.f.poll(l.kinds[:0]); err != nil {
		l.b.Fatal(err)
	}
	n := 0
	for _, k := range l.kinds {
		if k != floorAnswer {
			l.b.Fatalf("floor message of kind %d", k)
		}
		if err := l.f.send(floorDone); err != nil {
			l.b.Fatal(err)
		}
		n++
	}
	ended := l.dues[:n:n]
	l.dues = l.dues[n:]
	return ended
}

func (l *floorLoad) inFlight() int                       { return len(l.dues) }
func (l *floorLoad) failed() int                         { return 0 }
func (l *floorLoad) wait(context.Context, time.Duration) {}

// newFloorLoad connects a floor load to the engine producer proc, whose
// engine must be busy: its floor server answers from its loop.
func newFloorLoad(b *testing.B, proc engineProc, mode floorMode, payload int) *floorLoad {
	f := must(newFloorConn(must(net.Dial("tcp", proc.floors[mode])), mode))
	b.Cleanup(f.close)
	if mode == floorPolledBytes {
		f.payload, f.recv = make([]byte, payload), true
	}
	return &floorLoad{b: b, f: f, name: floorNames[mode]}
}
