package transport

import (
	"bufio"
	"bytes"
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmtransport "github.com/go-zeromq/zmq4/transport"

	"github.com/ecxfer/ecxfer/xfer"
)

// The guard sits between zmq4 and the TCP socket: zmq4 does all its I/O
// through the net.Conn a registered transport returns, so the guard sees
// every byte and fixes what zmq4 v0.17.0 gets wrong on the byte stream:
//
//   - frame and message size caps, checked before zmq4 reads a size, so a
//     declared 2^62-byte frame closes one connection instead of the process;
//   - ZMTP heartbeats: PINGs are answered with PONGs and no command
//     reaches the application; the guard sends its own PINGs and closes a
//     connection whose peer stays silent;
//   - what a peer can make it hold is bounded by us: at most one PONG and
//     one PING of ours wait unwritten, and a frame's buffer grows as its
//     bytes arrive, not to the size the peer declared;
//   - a write deadline, so one stalled peer cannot hold a writer forever;
//   - on the server side, the handshake runs off zmq4's serial accept loop,
//     with a deadline and a cap on pending handshakes.
//
// It also coalesces each outgoing message into one write.

// guardConfig holds the limits of one control-plane socket.
type guardConfig struct {
	maxFrame         uint64 // largest data frame accepted
	maxFrames        int    // frames per message
	pingInterval     time.Duration
	peerTimeout      time.Duration // silence after which the peer is dead
	writeTimeout     time.Duration
	handshakeTimeout time.Duration
	connectTimeout   time.Duration
	maxPending       int // server: handshakes in progress at once
	onDrop           func(reason string)
	onAccept         func()
	// Server: connections handed to zmq4 at once, in all and from one
	// host. At either cap the one idle longest goes (see admitLocked),
	// told to onShed. seq ticks at each accept and each request, so that
	// the order of connections by idleness needs no clock.
	maxConns        int
	maxConnsPerHost int
	seq             *atomic.Uint64
	onShed          func()
	// Client side, per dealer: stop aborts a dial or handshake in
	// progress (zmq4's Close does not), and track is told of the
	// connection so that its owner can close it.
	stop  <-chan struct{}
	track func(net.Conn)
	// The same-host channel (local.go). local: a server offers one.
	// onOffer: a client's dealer takes a server's offer. pre: a client
	// proves the socket it dialed before the ZMTP handshake.
	local   bool
	onLocal func(ok bool) // server: a hello on the same-host socket, taken or refused
	onOffer func(g *guardConn, body []byte)
	pre     func(c net.Conn) error
	// listener is a server's, once listening (for tests).
	listener *guardListener
	// group holds the guard's own goroutines (accept loop, handshakes,
	// heartbeats, writers), for the owner's Close to wait on.
	group *goGroup

	// The message path. Once a connection's handshake is done, the guard
	// reads and writes whole messages itself, on zmq4's reader goroutine
	// and the caller's goroutine, instead of going through zmq4's queues
	// and per-send goroutines (six goroutine hand-offs per round trip).
	// deliver takes one inbound message (its frames: it may keep their
	// bodies, not the slice, which is reused); false stops the
	// connection. ready is told of a connection whose handshake is done;
	// gone of one that closed. maxOut caps a connection's unwritten
	// messages.
	deliver func(g *guardConn, frames [][]byte) bool
	ready   func(g *guardConn)
	gone    func(g *guardConn)
	maxOut  int
	// replies, on a server, bounds the bytes its connections hold unwritten.
	replies *replyBudget
	// steps, if set, is the owner's: while the owner is stepped, its
	// Drains read the connections that are busy (see stepReads), and
	// take the messages they read, as deliver does for the goroutine's.
	steps *stepReads
	take  func(g *guardConn, frames [][]byte) bool
	// own, on a client, takes what the owner's wait read itself (see
	// stepReads.mine): queued as deliver does, without waiting for room.
	own func(g *guardConn, frames [][]byte) bool
}

// spawn runs f on a goroutine of the owner's group; false once the group
// is closed.
func (c *guardConfig) spawn(f func()) bool { return c.group.spawn(f) }

// goGroup is a WaitGroup that refuses new goroutines once waited on, so
// that a heartbeat started by a late READY cannot race its owner's Close.
type goGroup struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{}
}

func (g *goGroup) spawn(f func()) bool {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false
	}
	g.n++
	g.mu.Unlock()
	go func() {
		defer func() {
			g.mu.Lock()
			if g.n--; g.n == 0 && g.zero != nil {
				close(g.zero)
				g.zero = nil
			}
			g.mu.Unlock()
		}()
		f()
	}()
	return true
}

// wait closes the group and waits for its goroutines to return.
func (g *goGroup) wait() {
	g.mu.Lock()
	g.closed = true
	if g.n == 0 {
		g.mu.Unlock()
		return
	}
	if g.zero == nil {
		g.zero = make(chan struct{})
	}
	ch := g.zero
	g.mu.Unlock()
	<-ch
}

const (
	greetingLen = 64
	maxCommand  = 16 << 10 // READY with metadata is a few hundred bytes
	// readChunk is the most allocated for bytes that have not arrived: a
	// larger frame's buffer grows as they do, so a peer that declares a
	// large frame and sends it slowly makes us hold about twice what it
	// sent, not what it declared.
	readChunk   = 64 << 10
	coalesceMax = 64 << 10 // larger messages are written through
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// Commands (READY in the handshakes included) are read whole, at their
// declared size: this fails to compile if the cap passes readChunk.
const _ = uint(readChunk - maxCommand)

var errGuard = errors.New("transport: ZMTP peer broke the rules")

// zmtpGreeting is the greeting zmq4 v0.17.0 sends (ZMTP 3.0, NULL, as
// client). The server-side guard sends it on zmq4's behalf and swallows
// zmq4's own copy.
var zmtpGreeting = func() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}()

// validGreeting checks a peer's greeting: signature, version 3 or later,
// NULL security.
func validGreeting(g []byte) bool {
	return g[0] == 0xff && g[9] == 0x7f && g[10] >= 3 && string(bytes.TrimRight(g[12:32], "\x00")) == "NULL" &&
		g[32] <= 1 // as-server: zmq4 fails on any other value and leaves the connection open
}

// guardConn wraps one TCP connection.
type guardConn struct {
	net.Conn
	cfg *guardConfig
	// why is the error fail closed the connection for, if it did.
	why atomic.Pointer[error]

	// inbound, used by zmq4's reader goroutine
	rmu       sync.Mutex
	pre       []byte // bytes read ahead during the server handshake
	br        *bufio.Reader
	greetLeft int    // greeting bytes still to pass through
	pass      []byte // bytes to hand to zmq4 before reading more
	bodyLeft  uint64 // bytes of a data frame still to pass through
	msgFrames int    // frames of the current inbound message
	msgBytes  uint64
	hdr       [9]byte
	cmd       []byte
	readyIn   atomic.Bool
	lastRecv  atomic.Int64  // unix nanos of the last byte received
	lastMsg   atomic.Uint64 // server: cfg.seq at its last request, or at its accept
	host      string        // server: the peer's address without its port
	server    bool          // our side is the ROUTER
	inBytes   atomic.Uint64 // bytes read from the socket, for tests

	// outbound
	wmu      sync.Mutex
	swallow  int    // bytes of zmq4's greeting not to send (server)
	out      []byte // message being coalesced
	outParse frameParser
	pongs    []byte // a PONG and a PING waiting for a message boundary
	pqueued  uint8  // which of them pongs holds
	readyOut atomic.Bool
	broken   error

	// the message path (after the handshake)
	identity []byte // the peer's Identity property (server: or one we made)
	raw      *nbWriter
	omu      sync.Mutex
	opend    []byte // encoded messages not yet written
	octl     []byte // our commands waiting for the writer, after opend
	oqueued  uint8  // our commands not yet written: at most one of each
	omsgs    int    // messages appended since opend was last empty
	owriting bool   // the writer goroutine owns the socket's write side
	owlen    int    // bytes the writer is writing
	oacct    int    // bytes of opend counted in cfg.replies
	wacct    int    // bytes the writer is writing counted there
	obroken  error
	okick    chan struct{}

	// The message path's inbound side: whoever reads the socket, the
	// connection's goroutine or a Drain (see stepReads), feeds what
	// arrived under smu.
	smu      sync.Mutex
	in       []byte   // bytes not parsed yet
	inFrames [][]byte // the frames of the message being read
	inHdr    bool     // the frame header at in's start passed the caps
	inWant   int      // a large frame in part: the length in must reach to hold it
	sink     func(g *guardConn, frames [][]byte) bool
	hot      atomic.Bool   // Drains read the socket; the goroutine waits on cool
	cool     chan struct{} // wakes the goroutine when it is no longer hot
	empty    int           // Drains in a row that found nothing, under smu
	sunk     uint64        // messages a client's sink queued for Drain, under smu

	closeOnce sync.Once
	done      chan struct{}
	started   atomic.Bool
	onClose   func()        // the listener forgets it
	offer     func() []byte // server: the same-host offer for this connection, or nil
}

func newGuardConn(c net.Conn, cfg *guardConfig, pre []byte, server bool) *guardConn {
	c = quietIO(c)
	g := &guardConn{Conn: c, cfg: cfg, pre: pre, greetLeft: greetingLen, done: make(chan struct{}),
		okick: make(chan struct{}, 1), cool: make(chan struct{}, 1)}
	g.br = bufio.NewReaderSize(guardSrc{g}, 16<<10)
	g.raw = newNBWriter(c)
	g.outParse.greetLeft = greetingLen
	g.server = server
	if server {
		g.swallow = greetingLen // already sent by the listener
		g.outParse.greetLeft = 0
	}
	g.lastRecv.Store(time.Now().UnixNano())
	if !server {
		// zmq4 runs the client handshake itself: bound it.
		c.SetDeadline(time.Now().Add(cfg.handshakeTimeout))
	}
	return g
}

// Close closes the connection once and stops the pinger.
func (g *guardConn) Close() error {
	var err error
	first := false
	g.closeOnce.Do(func() {
		first = true
		close(g.done)
		err = g.Conn.Close()
		if g.cfg.replies != nil {
			g.cfg.replies.drop(g) // what it held unwritten is no longer owed
		}
		if g.onClose != nil {
			g.onClose()
		}
	})
	if first && g.cfg.gone != nil && g.started.Load() {
		g.cfg.gone(g) // outside the Once: gone may close g again
	}
	return err
}

// fail closes the connection because of what the peer did (or did not do).
func (g *guardConn) fail(reason string) error {
	return g.failWith(fmt.Errorf("%w: %s", errGuard, reason), reason)
}

// failWith is fail for a cause that is err.
func (g *guardConn) failWith(err error, reason string) error {
	if g.cfg.onDrop != nil {
		g.cfg.onDrop(reason)
	}
	g.why.CompareAndSwap(nil, &err)
	g.Close()
	return err
}

// cause says why the connection closed: what fail closed it for, or that
// it closed (the peer's doing, or the network's).
func (g *guardConn) cause() error {
	if e := g.why.Load(); e != nil {
		return *e
	}
	return errConnClosed
}

// stalled is why a connection whose peer stopped reading was cut off.
func (g *guardConn) stalled() error {
	return fmt.Errorf("transport: the peer took no byte for %v (the write timeout): cut off as not reading", g.cfg.writeTimeout)
}

// errConnClosed: the connection closed, by the peer or the network.
var errConnClosed = errors.New("connection closed")

// guardSrc is what the guard's bufio.Reader reads: the read-ahead buffer
// first, then the network.
type guardSrc struct{ g *guardConn }

func (s guardSrc) Read(p []byte) (int, error) {
	g := s.g
	if len(g.pre) > 0 {
		n := copy(p, g.pre)
		g.pre = g.pre[n:]
		return n, nil
	}
	n, err := g.Conn.Read(p)
	if n > 0 {
		g.lastRecv.Store(time.Now().UnixNano())
		g.inBytes.Add(uint64(n))
	}
	return n, err
}

// src reads buffered bytes: one system call brings in many small frames.
func (g *guardConn) src(p []byte) (int, error) { return g.br.Read(p) }

func (g *guardConn) srcFull(p []byte) error {
	_, err := io.ReadFull(g.br, p)
	return err
}

// Read hands zmq4 the inbound stream with heartbeats removed, refusing
// frames over the caps before zmq4 sees their size.
func (g *guardConn) Read(p []byte) (int, error) {
	n, err := g.read(p)
	if err != nil && g.started.Load() {
		err = forgettable(err)
	}
	return n, err
}

// forgettable returns err as one that makes zmq4 forget the connection.
// zmq4 drops a connection from its socket (and its writers) only on EOF
// or a network error that is not a timeout; on any other error its reader
// just returns, and the socket keeps the connection, and what it holds,
// until the socket closes. Only once the handshake is done: a connection
// zmq4 failed to open is one it never took, and telling it to forget one
// makes it keep a reference (ZMQ4.md, 4d).
func forgettable(err error) error {
	var ne net.Error
	if errors.Is(err, io.EOF) || errors.As(err, &ne) && !ne.Timeout() {
		return err
	}
	return fmt.Errorf("%w: %w", net.ErrClosed, err)
}

func (g *guardConn) read(p []byte) (int, error) {
	g.rmu.Lock()
	defer g.rmu.Unlock()
	for {
		if len(g.pass) > 0 {
			n := copy(p, g.pass)
			g.pass = g.pass[n:]
			return n, nil
		}
		if g.bodyLeft > 0 {
			n, err := g.src(p[:min(uint64(len(p)), g.bodyLeft)])
			g.bodyLeft -= uint64(n)
			return n, err
		}
		if g.greetLeft > 0 {
			buf := make([]byte, greetingLen)
			if err := g.srcFull(buf); err != nil {
				return 0, err
			}
			if !validGreeting(buf) {
				return 0, g.fail("bad greeting")
			}
			g.greetLeft = 0
			g.pass = buf
			continue
		}
		if err := g.nextFrame(); err != nil {
			return 0, err
		}
	}
}

// nextFrame reads one frame header (and a command's body) and decides what
// zmq4 gets to see. The first data frame on a connection with a message
// path switches it to the guard's own loop for good.
func (g *guardConn) nextFrame() error {
	flags, hl, size, err := g.header()
	if err != nil {
		return err
	}
	if flags&flagCommand != 0 {
		ready, err := g.command(flags, size)
		if ready {
			g.pass = append(append([]byte(nil), g.hdr[:hl]...), g.cmd...)
			g.handshakeStep()
		}
		return err
	}
	if err := g.dataFrame(flags, size); err != nil {
		return err
	}
	if g.cfg.deliver != nil {
		err := g.messages(hl)
		g.Close()
		return err
	}
	g.pass = append(g.pass[:0], g.hdr[:hl]...)
	g.bodyLeft = size
	return nil
}

// header reads a frame header and returns its flags, length and size.
func (g *guardConn) header() (flags byte, hl int, size uint64, err error) {
	if err := g.srcFull(g.hdr[:2]); err != nil {
		return 0, 0, 0, err
	}
	flags = g.hdr[0]
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, 0, 0, g.fail("bad frame flags")
	}
	hl, size = 2, uint64(g.hdr[1])
	if flags&flagLong != 0 {
		if err := g.srcFull(g.hdr[2:9]); err != nil {
			return 0, 0, 0, err
		}
		hl = 9
		size = binary.BigEndian.Uint64(g.hdr[1:9])
	}
	return flags, hl, size, nil
}

// command reads and acts on a command frame; ready reports a valid first
// READY, which zmq4 must see.
func (g *guardConn) command(flags byte, size uint64) (ready bool, err error) {
	if flags&flagMore != 0 || size > maxCommand || g.msgFrames > 0 {
		return false, g.fail("bad command frame")
	}
	g.cmd = append(g.cmd[:0], make([]byte, size)...)
	if err := g.srcFull(g.cmd); err != nil {
		return false, err
	}
	return g.onCommand(g.cmd)
}

// onCommand acts on a command frame's body; ready reports a valid first
// READY.
func (g *guardConn) onCommand(c []byte) (ready bool, err error) {
	name, body, ok := parseCommand(c)
	if !ok {
		return false, g.fail("bad command")
	}
	switch name {
	case "PING":
		if len(body) < 2 {
			return false, g.fail("bad PING")
		}
		ctx := body[2:]
		if len(ctx) > 16 {
			ctx = ctx[:16]
		}
		g.queuePong(ctx)
	case "READY":
		if !validMetadata(body) {
			return false, g.fail("bad READY metadata")
		}
		if !peerTypeOK(body, g.server) {
			return false, g.fail("READY without a compatible Socket-Type")
		}
		if g.readyIn.Swap(true) {
			return false, g.fail("second READY")
		}
		g.identity = metaProp(body, "Identity")
		return true, nil
	case "ERROR":
		return false, g.fail("peer sent ERROR")
	case localCmd:
		switch {
		case g.server && g.offer != nil:
			if cmd := g.offer(); cmd != nil {
				g.sendCommand(ctlLocal, cmd)
			}
		case !g.server && g.cfg.onOffer != nil:
			g.cfg.onOffer(g, body)
		}
	}
	return false, nil // PONG, and nothing else concerns DEALER/ROUTER
}

// dataFrame checks a data frame's header against the caps.
func (g *guardConn) dataFrame(flags byte, size uint64) error {
	if !g.readyIn.Load() {
		return g.fail("message before READY")
	}
	g.msgFrames++
	g.msgBytes += size
	if size > g.cfg.maxFrame || g.msgBytes > g.cfg.maxFrame+4096 || g.msgFrames > g.cfg.maxFrames {
		return g.fail(fmt.Sprintf("frame of %d bytes over the cap", size))
	}
	if flags&flagMore == 0 {
		g.msgFrames, g.msgBytes = 0, 0
	}
	return nil
}

// messages is the inbound message path. Its first data frame's header,
// checked (flags, size), is in g.hdr[:hl]; from there on the bytes that
// arrive are fed to the parser (feed), which delivers whole messages,
// until the connection fails or deliver says stop. It runs on zmq4's
// reader goroutine, which never sees a data frame: that goroutine reads
// the socket, waiting in Go's poller, except while the connection is hot
// (see stepReads), when the Drains of a stepped owner read it instead and
// the goroutine waits to be cooled.
func (g *guardConn) messages(hl int) error {
	g.smu.Lock()
	g.in = append(g.in[:0], g.hdr[:hl]...)
	if k := g.br.Buffered(); k > 0 { // read ahead, then the handshake's
		b, _ := g.br.Peek(k)
		g.in = append(g.in, b...)
		g.br.Discard(k)
	}
	g.in = append(g.in, g.pre...)
	g.pre = nil
	g.inHdr = true
	g.sink = g.cfg.deliver
	err := g.feed(nil)
	g.smu.Unlock()
	if err != nil {
		return err
	}
	buf := make([]byte, 16<<10)
	for {
		if g.hot.Load() {
			select {
			case <-g.cool:
			case <-g.done:
				return net.ErrClosed
			}
			continue
		}
		n, err := g.Conn.Read(buf)
		delivered := false
		if n > 0 {
			g.received(n)
			g.smu.Lock()
			g.sink = g.cfg.deliver
			was := g.sunk
			ferr := g.feed(buf[:n])
			delivered = g.sunk != was
			g.smu.Unlock()
			if ferr != nil {
				return ferr
			}
		}
		if err != nil {
			return err
		}
		if st := g.cfg.steps; st != nil && !(delivered && g.cfg.own != nil && st.heatOwn(g)) {
			st.heat(g)
		}
	}
}

// received notes n bytes read from the socket.
func (g *guardConn) received(n int) {
	g.lastRecv.Store(time.Now().UnixNano())
	g.inBytes.Add(uint64(n))
}

// feed parses p, after the bytes held, delivering each whole message to
// g.sink (which may keep the frames' bodies, not the slice); under smu.
// Caps are checked as each frame's header arrives, and a frame's bytes
// are held as they arrive: a peer that declares a large frame and sends
// it slowly makes us hold what it sent, not what it declared.
func (g *guardConn) feed(p []byte) error {
	if n := len(g.in) + len(p); n > cap(g.in) && g.inWant > 0 {
		// A large frame grows its buffer by doubling as it arrives, and
		// to its whole size once that is at most four times the buffer:
		// the old buffer and the new one together hold at most half as
		// much again as the frame, and what is held stays within four
		// times what the peer sent.
		c := min(g.inWant, 2*cap(g.in))
		if 4*cap(g.in) >= g.inWant {
			c = g.inWant
		}
		nb := make([]byte, len(g.in), max(n, c))
		g.in = nb[:copy(nb, g.in)]
	}
	g.in = append(g.in, p...)
	b := g.in
	handed := false // a large body went with its message: in is not reused
	want := 0       // a large frame in part: its length, header and body
	var err error
	for err == nil && len(b) >= 2 {
		flags, hl, size := b[0], 2, uint64(b[1])
		if flags&^(flagMore|flagLong|flagCommand) != 0 {
			err = g.fail("bad frame flags")
			break
		}
		if flags&flagLong != 0 {
			if len(b) < 9 {
				break
			}
			hl, size = 9, binary.BigEndian.Uint64(b[1:9])
		}
		if !g.inHdr {
			if flags&flagCommand != 0 {
				if flags&flagMore != 0 || size > maxCommand || g.msgFrames > 0 {
					err = g.fail("bad command frame")
					break
				}
			} else if err = g.dataFrame(flags, size); err != nil {
				break
			}
			g.inHdr = true
		}
		if uint64(len(b)-hl) < size {
			if size > readChunk {
				want = hl + int(size)
			}
			break
		}
		body := b[hl : hl+int(size) : hl+int(size)]
		b = b[hl+int(size):]
		g.inHdr = false
		if flags&flagCommand != 0 {
			var ready bool
			if ready, err = g.onCommand(body); err == nil && ready {
				err = g.fail("second READY") // onCommand refuses one: unreachable
			}
			continue
		}
		if size > readChunk {
			handed = true // the body is the buffer's: no copy of a large frame
		} else {
			body = bytes.Clone(body)
		}
		g.inFrames = append(g.inFrames, body)
		if flags&flagMore == 0 {
			ok := g.sink(g, g.inFrames)
			clear(g.inFrames)
			g.inFrames = g.inFrames[:0]
			if !ok {
				err = net.ErrClosed
			}
		}
	}
	switch {
	case handed:
		g.in = append([]byte(nil), b...)
	case len(b) == len(g.in): // nothing parsed: a frame still arriving
	case cap(g.in) > readChunk && len(b) < readChunk/2:
		g.in = append([]byte(nil), b...) // a large frame's buffer goes with it
	default:
		g.in = g.in[:copy(g.in, b)]
	}
	g.inWant = want // the frame in part starts in's bytes now
	return err
}

// metaProp returns the value of a READY property (names are
// case-insensitive), or nil.
func metaProp(md []byte, name string) []byte {
	var v []byte
	eachProp(md, func(k, val []byte) bool {
		if strings.EqualFold(string(k), name) {
			v = append([]byte(nil), val...)
			return false
		}
		return true
	})
	return v
}

// eachProp calls f with each READY property (name length byte, name, value
// length u32, value; to the end) until f returns false, and reports
// whether they were well formed as far as it went.
func eachProp(md []byte, f func(k, v []byte) bool) bool {
	for len(md) > 0 {
		kl := int(md[0])
		if kl == 0 || len(md) < 1+kl+4 {
			return false
		}
		k := md[1 : 1+kl]
		vl := binary.BigEndian.Uint32(md[1+kl:])
		md = md[1+kl+4:]
		if uint64(vl) > uint64(len(md)) {
			return false
		}
		if !f(k, md[:vl]) {
			return true
		}
		md = md[vl:]
	}
	return true
}

// peerTypeOK reports whether READY's properties (valid ones) name a
// socket type zmq4 takes for our side's peer: every property whose name
// folds to Socket-Type spelled in ASCII as zmq4 title-cases it, with a
// type a ROUTER (server) or a DEALER talks to, and at least one. zmq4
// v0.17.0 reads the last one whose title-cased name is "Socket-Type" and
// panics on a type it does not know, or on none.
func peerTypeOK(md []byte, server bool) bool {
	found, ok := false, true
	eachProp(md, func(kb, vb []byte) bool {
		k := string(kb)
		if !strings.EqualFold(k, "Socket-Type") {
			return true
		}
		if len(k) != len("Socket-Type") || k[1:7] != "ocket-" || k[8:] != "ype" || (k[0] != 's' && k[0] != 'S') || (k[7] != 't' && k[7] != 'T') {
			ok = false // spelled so that zmq4 may not see it
			return false
		}
		switch string(vb) {
		case "DEALER", "ROUTER":
		case "REQ":
			ok = server
		case "REP":
			ok = !server
		default:
			ok = false
		}
		found = true
		return ok
	})
	return ok && found
}

// parseCommand splits a command body into its name and data.
func parseCommand(c []byte) (string, []byte, bool) {
	if len(c) < 1 || int(c[0]) > len(c)-1 {
		return "", nil, false
	}
	return string(c[1 : 1+c[0]]), c[1+c[0]:], true
}

// validMetadata checks READY's properties (name length byte, name, value
// length u32, value; to the end) before zmq4 parses them: zmq4 v0.17.0
// indexes past the end of malformed ones and panics.
func validMetadata(md []byte) bool {
	return eachProp(md, func(k, v []byte) bool { return true })
}

// The commands the guard sends on its own. At most one of each waits
// unwritten, so a peer that PINGs and never reads costs us one PONG. A
// PING that comes while our PONG is unwritten gets none, rather than
// replacing it: the waiting PONG answers as well (libzmq takes any byte
// as a sign of life), and one in the writer's hands could not be replaced
// anyway. A heartbeat tick while our PING is unwritten sends none either.
const (
	ctlPong uint8 = 1 << iota
	ctlPing
	ctlLocal
)

// queuePong answers a PING now if the outbound stream is between messages,
// else right after the message being written.
func (g *guardConn) queuePong(ctx []byte) {
	var buf [2 + 5 + 16]byte // ctx is at most 16 bytes
	pong := appendCommand(buf[:0], "PONG", ctx)
	if g.started.Load() && g.cfg.deliver != nil {
		g.sendCommand(ctlPong, pong)
		return
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.pqueued&ctlPong != 0 {
		return
	}
	g.pongs = append(g.pongs, pong...)
	g.pqueued |= ctlPong
	if len(g.out) == 0 && g.outParse.atBoundary() {
		g.flushLocked(nil)
	}
}

func appendCommand(b []byte, name string, data []byte) []byte {
	n := 1 + len(name) + len(data)
	b = append(b, flagCommand, byte(n), byte(len(name)))
	b = append(b, name...)
	return append(b, data...)
}

// Write takes zmq4's output, coalescing each message into one write and
// slipping queued PONGs in between messages.
func (g *guardConn) Write(p []byte) (int, error) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.broken != nil {
		return 0, g.broken
	}
	n := len(p)
	if g.swallow > 0 {
		k := min(g.swallow, len(p))
		g.swallow -= k
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	if g.outParse.feed(p) {
		g.readyOut.Store(true)
		g.handshakeStep()
	}
	if len(g.out)+len(p) > coalesceMax {
		if err := g.flushLocked(p); err != nil {
			return 0, err
		}
		return n, nil
	}
	g.out = append(g.out, p...)
	if g.outParse.atBoundary() {
		if err := g.flushLocked(nil); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// flushLocked writes the coalesced bytes, then extra, then queued PONGs if
// that ends at a message boundary. A peer that takes no byte for the write
// timeout is treated as gone: the connection is closed.
func (g *guardConn) flushLocked(extra []byte) error {
	bufs := net.Buffers{g.out, extra}
	if g.outParse.atBoundary() && len(g.pongs) > 0 {
		bufs = append(bufs, g.pongs)
	}
	err := writeFull(g.Conn, bufs, g.cfg.writeTimeout)
	g.out = g.out[:0]
	if g.outParse.atBoundary() {
		g.pongs, g.pqueued = g.pongs[:0], 0
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			g.failWith(g.stalled(), "write deadline passed")
		} else {
			g.Close()
		}
		// zmq4 drops a connection only on errors that are not timeouts.
		g.broken = fmt.Errorf("%w: %v", net.ErrClosed, err)
		return g.broken
	}
	return nil
}

// handshakeStep starts heartbeats (and the writer of the message path)
// once READY went both ways.
func (g *guardConn) handshakeStep() {
	if g.readyIn.Load() && g.readyOut.Load() && g.started.CompareAndSwap(false, true) {
		g.Conn.SetDeadline(time.Time{})
		g.lastRecv.Store(time.Now().UnixNano())
		g.cfg.spawn(g.heartbeat)
		if g.cfg.deliver != nil && g.cfg.spawn(g.writer) && g.cfg.ready != nil {
			g.cfg.ready(g)
		}
	}
}

// heartbeat sends PINGs and closes the connection when the peer has been
// silent for longer than the peer timeout.
func (g *guardConn) heartbeat() {
	t := time.NewTicker(g.cfg.pingInterval)
	defer t.Stop()
	ttl := uint16(min(g.cfg.peerTimeout/(100*time.Millisecond), 0xffff))
	ping := appendCommand(nil, "PING", []byte{byte(ttl >> 8), byte(ttl)})
	for {
		select {
		case <-g.done:
			return
		case now := <-t.C:
			if now.Sub(time.Unix(0, g.lastRecv.Load())) > g.cfg.peerTimeout {
				g.failWith(fmt.Errorf("transport: nothing heard for %v: %w", g.cfg.peerTimeout, xfer.ErrPeerSilent), "peer silent")
				return
			}
			if g.cfg.deliver != nil {
				g.sendCommand(ctlPing, ping)
				continue
			}
			g.wmu.Lock()
			if g.broken == nil && len(g.out) == 0 && g.outParse.atBoundary() {
				g.pongs = append(g.pongs, ping...)
				g.flushLocked(nil)
			}
			g.wmu.Unlock()
		}
	}
}

// send writes one message of the given frames, or queues it for the
// writer: it never blocks. It fails with xfer.ErrQueueFull when maxOut messages
// are waiting, and with net.ErrClosed once the connection failed.
func (g *guardConn) send(frames ...[]byte) error {
	n := 0
	for _, f := range frames {
		n += 9 + len(f)
	}
	// Encoded into a pooled scratch buffer: what the socket does not take
	// is copied to the queue, so nothing is allocated per message, and an
	// idle connection keeps no scratch of its own.
	sp := sendScratch.Get().(*[]byte)
	msg := slices.Grow((*sp)[:0], n)
	for i, f := range frames {
		flags := byte(0)
		if i < len(frames)-1 {
			flags = flagMore
		}
		if len(f) > 255 {
			msg = append(msg, flags|flagLong)
			msg = binary.BigEndian.AppendUint64(msg, uint64(len(f)))
		} else {
			msg = append(msg, flags, byte(len(f)))
		}
		msg = append(msg, f...)
	}
	g.omu.Lock()
	err := g.sendRawLocked(msg, 0)
	if cap(msg) <= 64<<10 {
		*sp = msg // a rare large one is not kept
	}
	sendScratch.Put(sp)
	return err
}

// sendScratch holds send's scratch buffers.
var sendScratch = sync.Pool{New: func() any { return new([]byte) }}

// sendCommand writes cmd, one of our commands of the given kind, like a
// message, unless one of its kind is still unwritten: then cmd is dropped.
// A whole command waits in octl, after the messages queued before it.
func (g *guardConn) sendCommand(kind uint8, cmd []byte) {
	g.omu.Lock()
	if g.obroken != nil || g.oqueued&kind != 0 {
		g.omu.Unlock()
		return
	}
	if g.owriting || len(g.opend) > 0 || g.raw == nil {
		g.octl = append(g.octl, cmd...)
		g.oqueued |= kind
		g.omu.Unlock()
		g.kick()
		return
	}
	g.sendRawLocked(cmd, kind)
}

// sendRawLocked writes msg (whole messages, or one command of kind
// ctlPong or ctlPing) at once if nothing is queued and the socket takes it
// without waiting; the rest goes to the writer goroutine. Messages (kind
// 0) are subject to maxOut. It is called with omu held and releases it.
// msg is not kept.
func (g *guardConn) sendRawLocked(msg []byte, kind uint8) error {
	if e := g.obroken; e != nil {
		g.omu.Unlock()
		return e
	}
	if kind == 0 && g.cfg.maxOut > 0 && g.omsgs >= g.cfg.maxOut {
		g.omu.Unlock()
		return xfer.ErrQueueFull
	}
	direct := !g.owriting && len(g.opend) == 0 && g.raw != nil
	if direct {
		n, err := g.tryWrite(msg)
		if err != nil {
			e := fmt.Errorf("%w: %v", net.ErrClosed, err)
			g.obroken = e
			g.omu.Unlock()
			g.Close()
			return e
		}
		msg = msg[n:]
		if len(msg) == 0 {
			g.omu.Unlock()
			return nil
		}
	}
	var cut []*guardConn
	if kind == 0 && g.cfg.replies != nil {
		// A message begun on the wire must be queued whole.
		ok, c := g.cfg.replies.queue(g, len(msg), direct)
		if !ok && !direct {
			g.omu.Unlock()
			return xfer.ErrQueueFull
		}
		if !ok { // closed or cut meanwhile, and no longer counted
			e := fmt.Errorf("%w: closed", net.ErrClosed)
			g.obroken = e
			g.omu.Unlock()
			g.Close() // part of a message may be on the wire
			return e
		}
		cut = c
		g.oacct += len(msg)
	}
	g.opend = append(g.opend, msg...)
	if kind == 0 {
		g.omsgs++
	}
	g.oqueued |= kind
	g.omu.Unlock()
	g.kick()
	var err error
	for _, c := range cut {
		c.fail("replies left unread past the server's bound")
		if c == g {
			err = fmt.Errorf("%w: replies left unread past the server's bound", net.ErrClosed)
		}
	}
	return err
}

// kick wakes the writer.
func (g *guardConn) kick() {
	select {
	case g.okick <- struct{}{}:
	default:
	}
}

// tryWrite writes what the socket takes without waiting.
func (g *guardConn) tryWrite(b []byte) (int, error) { return g.raw.write(b) }

// nbWriter writes what a non-blocking socket takes now, through its
// RawConn (which keeps the descriptor from being closed and reused under
// the call). Its callback is bound once: a closure per write cost three
// allocations, a third of a fetch's.
type nbWriter struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool
	b   []byte
	n   int
	err error
}

// newNBWriter returns c's writer, or nil if c has no descriptor.
func newNBWriter(c net.Conn) *nbWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &nbWriter{raw: raw}
	w.fn = w.once
	return w
}

func (w *nbWriter) once(fd uintptr) bool {
	for len(w.b) > 0 {
		k, err := rawWrite(fd, w.b)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return true
		}
		if err != nil {
			w.err = err
			return true
		}
		w.n += k
		w.b = w.b[k:]
	}
	return true
}

// write writes what the socket takes of b now. The caller must be the
// only writer.
func (w *nbWriter) write(b []byte) (int, error) {
	w.b, w.n, w.err = b, 0, nil
	err := w.raw.Write(w.fn)
	n, werr := w.n, w.err
	w.b, w.err = nil, nil
	if err == nil {
		err = werr
	}
	return n, err
}

// writeAll writes what the socket takes of bufs now, in order; it returns
// what is left (its first element may be a tail). The caller must be the
// only writer.
func (w *nbWriter) writeAll(bufs [][]byte) ([][]byte, error) {
	for i, b := range bufs {
		n, err := w.write(b)
		if err != nil {
			return bufs[i:], err
		}
		if n < len(b) {
			bufs[i] = b[n:]
			return bufs[i:], nil
		}
	}
	return nil, nil
}

// keepOut is the largest outbound buffer a connection keeps once empty.
const keepOut = 64 << 10

// writer writes what sendRawLocked and sendCommand could not. A peer that
// takes no byte for the write timeout is cut off (one that reads steadily
// is not, however much waits for it: the reply budget bounds that), and no
// other connection waits for it.
func (g *guardConn) writer() {
	var buf []byte
	var took uint8 // our commands in buf
	for {
		select {
		case <-g.done:
			return
		case <-g.okick:
		}
		for {
			g.omu.Lock()
			g.oqueued &^= took // written
			took, g.owlen = 0, 0
			if g.wacct > 0 {
				g.cfg.replies.written(g, g.wacct)
				g.wacct = 0
			}
			// A buffer grown past keepOut is let go once written: what a
			// connection keeps beyond the bytes counted stays small.
			if cap(buf) > keepOut {
				buf = nil
			}
			if len(g.opend)+len(g.octl) == 0 || g.obroken != nil {
				g.owriting, g.omsgs = false, 0
				if cap(g.opend) > keepOut {
					g.opend = nil
				}
				g.omu.Unlock()
				break
			}
			buf, g.opend = g.opend, buf[:0]
			g.wacct, g.oacct = g.oacct, 0
			buf = append(buf, g.octl...) // whole commands, after whole messages
			g.octl = g.octl[:0]
			took = g.oqueued
			g.owriting = true
			g.owlen = len(buf)
			g.omu.Unlock()
			err := writeFull(g.Conn, net.Buffers{buf}, g.cfg.writeTimeout)
			if err != nil {
				g.omu.Lock()
				g.obroken = fmt.Errorf("%w: %v", net.ErrClosed, err)
				g.owriting, g.owlen = false, 0
				g.omu.Unlock()
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					g.failWith(g.stalled(), "write deadline passed")
				} else {
					g.Close()
				}
				return
			}
		}
	}
}

// pendingOut returns the bytes the guard holds that the socket has not
// taken yet, for tests.
func (g *guardConn) pendingOut() int {
	g.omu.Lock()
	n := len(g.opend) + len(g.octl) + g.owlen
	g.omu.Unlock()
	g.wmu.Lock()
	n += len(g.out) + len(g.pongs)
	g.wmu.Unlock()
	return n
}

// frameParser follows zmq4's outbound stream to know where messages end.
type frameParser struct {
	greetLeft int
	hdr       [9]byte
	hdrHave   int
	bodyLeft  uint64
	more      bool // inside a multipart message
	cmdHead   []byte
}

// atBoundary reports whether the stream is between messages.
func (f *frameParser) atBoundary() bool {
	return f.greetLeft == 0 && f.hdrHave == 0 && f.bodyLeft == 0 && !f.more
}

// feed follows p; it returns true when a READY command was completed.
func (f *frameParser) feed(p []byte) (ready bool) {
	for len(p) > 0 {
		switch {
		case f.greetLeft > 0:
			k := min(f.greetLeft, len(p))
			f.greetLeft -= k
			p = p[k:]
		case f.bodyLeft > 0:
			k := min(f.bodyLeft, uint64(len(p)))
			if f.cmdHead != nil && len(f.cmdHead) < 6 {
				f.cmdHead = append(f.cmdHead, p[:min(int(k), 6-len(f.cmdHead))]...)
			}
			f.bodyLeft -= k
			p = p[k:]
			if f.bodyLeft == 0 && f.cmdHead != nil {
				if string(f.cmdHead) == "\x05READY" {
					ready = true
				}
				f.cmdHead = nil
			}
		default:
			f.hdr[f.hdrHave] = p[0]
			f.hdrHave++
			p = p[1:]
			flags := f.hdr[0]
			need := 2
			if flags&flagLong != 0 {
				need = 9
			}
			if f.hdrHave < need {
				continue
			}
			size := uint64(f.hdr[1])
			if need == 9 {
				size = binary.BigEndian.Uint64(f.hdr[1:9])
			}
			f.hdrHave = 0
			f.bodyLeft = size
			if flags&flagCommand != 0 {
				f.cmdHead = []byte{}
			} else {
				f.more = flags&flagMore != 0
			}
			if size == 0 && f.cmdHead != nil {
				f.cmdHead = nil
			}
		}
	}
	return ready
}

// ---- the registered transport ----

// guardScheme is the zmq4 transport name; addresses are
// "ecxfer-guard://<config key>@host:port".
const guardScheme = "ecxfer-guard"

var (
	guardConfigs sync.Map // key -> guardTarget
	guardKeys    atomic.Uint64
	registerOnce sync.Once
	registerErr  error
)

type guardTransport struct{}

func registerGuard() error {
	registerOnce.Do(func() {
		registerErr = zmq4RegisterTransport(guardScheme, guardTransport{})
	})
	return registerErr
}

// guardTarget is what a guard endpoint dials or binds.
type guardTarget struct {
	cfg *guardConfig
	ep  endpoint
}

// guardEndpoint registers cfg and returns the zmq4 endpoint for e, and a
// function that forgets cfg. The endpoint carries only a key: a path may
// hold anything, zmq4's parser only "scheme://rest".
func guardEndpoint(cfg *guardConfig, e endpoint) (string, func(), error) {
	if err := registerGuard(); err != nil {
		return "", nil, err
	}
	key := fmt.Sprint(guardKeys.Add(1))
	guardConfigs.Store(key, guardTarget{cfg, e})
	return guardScheme + "://" + key, func() { guardConfigs.Delete(key) }, nil
}

func lookupGuard(key string) (*guardConfig, endpoint, error) {
	v, ok := guardConfigs.Load(key)
	if !ok {
		return nil, endpoint{}, fmt.Errorf("transport: no guard config %q", key)
	}
	t := v.(guardTarget)
	return t.cfg, t.ep, nil
}

func (guardTransport) Addr(ep string) (string, error) {
	if _, _, err := lookupGuard(ep); err != nil {
		return "", err
	}
	return ep, nil
}

func (guardTransport) Dial(ctx context.Context, _ zmtransport.Dialer, addr string) (net.Conn, error) {
	cfg, e, err := lookupGuard(addr)
	if err != nil {
		return nil, err
	}
	if cfg.stop != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-cfg.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	d := net.Dialer{Timeout: cfg.connectTimeout}
	c, err := d.DialContext(ctx, e.network, e.addr)
	if err != nil {
		return nil, err
	}
	if cfg.pre != nil {
		// Nothing tracks c yet: a stop must end the exchange itself.
		proved := make(chan struct{})
		if cfg.stop != nil {
			go func() {
				select {
				case <-cfg.stop:
					c.Close()
				case <-proved:
				}
			}()
		}
		err := cfg.pre(c)
		close(proved)
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	gc := newGuardConn(c, cfg, nil, false)
	if cfg.track != nil {
		cfg.track(gc)
	}
	return gc, nil
}

func (guardTransport) Listen(_ context.Context, addr string) (net.Listener, error) {
	cfg, e, err := lookupGuard(addr)
	if err != nil {
		return nil, err
	}
	ln, err := listenEndpoint(e)
	if err != nil {
		return nil, err
	}
	gl := &guardListener{Listener: ln, cfg: cfg, ready: make(chan net.Conn), done: make(chan struct{}),
		pending: map[net.Conn]*list.Element{}, conns: map[*guardConn]struct{}{}, hosts: map[string]map[*guardConn]struct{}{},
		tickets: map[[localTicketLen]byte]localTicket{}, ticketOf: map[*guardConn][localTicketLen]byte{}}
	if cfg.local && e.network == "tcp" && localSupported {
		// Without it Go consumers on this host stay on TCP: not worth
		// failing the listen for.
		if lln, err := listenLocal(); err == nil {
			gl.local, gl.localName = lln, lln.Addr().String()
		}
	}
	if !cfg.spawn(func() { gl.acceptLoop(ln, false) }) {
		gl.Close()
		return nil, net.ErrClosed
	}
	if gl.local != nil && !cfg.spawn(func() { gl.acceptLoop(gl.local, true) }) {
		gl.Close()
		return nil, net.ErrClosed
	}
	cfg.listener = gl
	return gl, nil
}

// guardListener accepts connections and runs each handshake in its own
// goroutine with a deadline; zmq4's Accept gets only connections whose peer
// greeting and READY have arrived, so its serial Open never waits on the
// network.
type guardListener struct {
	net.Listener
	cfg       *guardConfig
	ready     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once

	mu      sync.Mutex
	pending map[net.Conn]*list.Element // handshakes in progress, oldest first
	order   list.List
	conns   map[*guardConn]struct{}            // handed to zmq4 and not closed
	hosts   map[string]map[*guardConn]struct{} // conns by the peer's host

	// The same-host socket (local.go), or nil, and the tickets it takes:
	// at most one per TCP connection, gone with it.
	local     net.Listener
	localName string
	tickets   map[[localTicketLen]byte]localTicket
	ticketOf  map[*guardConn][localTicketLen]byte
}

func (l *guardListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guardListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.Listener.Close()
		if l.local != nil {
			l.local.Close()
		}
		l.mu.Lock()
		for c := range l.pending {
			c.Close()
		}
		conns := make([]*guardConn, 0, len(l.conns))
		for g := range l.conns {
			conns = append(conns, g)
		}
		l.mu.Unlock()
		for _, g := range conns { // zmq4 may not have taken them all yet
			g.Close()
		}
	})
	return err
}

// acceptLoop accepts on ln, the TCP listener or the same-host one
// (local), and runs each handshake on its own goroutine.
func (l *guardListener) acceptLoop(ln net.Listener, local bool) {
	backoff := time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			time.Sleep(backoff) // EMFILE and friends: do not spin
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		if l.cfg.onAccept != nil {
			l.cfg.onAccept()
		}
		l.mu.Lock()
		if l.order.Len() >= l.cfg.maxPending {
			// Full: the oldest pending handshake goes, so that a flood of
			// silent connections cannot lock out a real client.
			old := l.order.Remove(l.order.Front()).(net.Conn)
			delete(l.pending, old)
			old.Close()
			if l.cfg.onDrop != nil {
				l.cfg.onDrop("pending handshake evicted")
			}
		}
		l.pending[c] = l.order.PushBack(c)
		l.mu.Unlock()
		if !l.cfg.spawn(func() { l.handshake(c, local) }) {
			c.Close()
			return
		}
	}
}

func (l *guardListener) handshake(c net.Conn, local bool) {
	var born uint64 // before our greeting: a peer's requests after it are news
	if l.cfg.seq != nil {
		born = l.cfg.seq.Add(1)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetDeadline(time.Now().Add(l.cfg.handshakeTimeout))
	var err error
	if local {
		err = l.redeem(c)
		if l.cfg.onLocal != nil {
			l.cfg.onLocal(err == nil)
		}
	}
	var pre []byte
	if err == nil {
		pre, err = serverHello(c)
	}
	l.mu.Lock()
	e, live := l.pending[c]
	if live {
		l.order.Remove(e)
		delete(l.pending, c)
	}
	l.mu.Unlock()
	if err != nil || !live {
		if err != nil && l.cfg.onDrop != nil {
			l.cfg.onDrop("handshake: " + err.Error())
		}
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	g := newGuardConn(c, l.cfg, pre, true)
	g.lastMsg.Store(born)
	g.host = peerHost(c)
	if l.local != nil && !local {
		g.offer = func() []byte {
			l.mu.Lock()
			defer l.mu.Unlock()
			if _, live := l.conns[g]; !live {
				return nil
			}
			return l.offerLocked(g)
		}
	}
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		c.Close()
		return
	default:
	}
	// A same-host connection sheds no one: its consumer holds a TCP
	// connection already, and stays on it.
	victim, ok := l.admitLocked(g, !local)
	if !ok {
		l.mu.Unlock()
		l.shed() // counted before the close: whoever sees it closed sees it counted
		g.Close()
		return
	}
	g.onClose = func() {
		l.mu.Lock()
		l.removeLocked(g)
		l.mu.Unlock()
	}
	l.addLocked(g)
	l.mu.Unlock()
	if victim != nil {
		l.shed()
		victim.Close() // its reader's error makes zmq4 forget it
	}
	select {
	case l.ready <- g:
	case <-l.done:
		g.Close()
	}
}

// admitLocked makes room for g at the caps: when g's host, or the
// server, holds as many connections as it may, the one of that host's, or
// of all, that has gone longest without a request (or since its accept,
// if it sent none) is removed, for the caller to close. A connection that
// carries requests is thus the last to go; g itself is refused (false)
// only when every candidate sent a request since g was accepted.
// Connections zmq4 is still opening are no candidates: they are gone in
// microseconds, and closing one under zmq4's Open would leave it a
// reference to keep. Unless mayShed, g is refused at a cap instead.
func (l *guardListener) admitLocked(g *guardConn, mayShed bool) (victim *guardConn, ok bool) {
	var pool map[*guardConn]struct{}
	switch {
	case l.cfg.maxConnsPerHost > 0 && len(l.hosts[g.host]) >= l.cfg.maxConnsPerHost:
		pool = l.hosts[g.host]
	case l.cfg.maxConns > 0 && len(l.conns) >= l.cfg.maxConns:
		pool = l.conns
	default:
		return nil, true
	}
	if !mayShed {
		return nil, false
	}
	var idle uint64
	for v := range pool {
		if !v.started.Load() {
			continue
		}
		if t := v.lastMsg.Load(); victim == nil || t < idle {
			victim, idle = v, t
		}
	}
	if victim == nil || idle > g.lastMsg.Load() {
		return nil, false
	}
	l.removeLocked(victim) // no longer counted, so no other newcomer picks it
	return victim, true
}

func (l *guardListener) shed() {
	if l.cfg.onShed != nil {
		l.cfg.onShed()
	}
}

func (l *guardListener) addLocked(g *guardConn) {
	l.conns[g] = struct{}{}
	h := l.hosts[g.host]
	if h == nil {
		h = map[*guardConn]struct{}{}
		l.hosts[g.host] = h
	}
	h[g] = struct{}{}
}

func (l *guardListener) removeLocked(g *guardConn) {
	l.forgetTicketLocked(g)
	delete(l.conns, g)
	if h := l.hosts[g.host]; h != nil {
		if delete(h, g); len(h) == 0 {
			delete(l.hosts, g.host)
		}
	}
}

// serverHello sends our greeting and reads the peer's greeting and READY.
func serverHello(c net.Conn) ([]byte, error) {
	if _, err := c.Write(zmtpGreeting); err != nil {
		return nil, err
	}
	pre := make([]byte, greetingLen, greetingLen+64)
	if _, err := io.ReadFull(c, pre); err != nil {
		return nil, err
	}
	if !validGreeting(pre) {
		return nil, errors.New("bad greeting")
	}
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:2]); err != nil {
		return nil, err
	}
	hl, size := 2, uint64(hdr[1])
	if hdr[0]&flagLong != 0 {
		if _, err := io.ReadFull(c, hdr[2:]); err != nil {
			return nil, err
		}
		hl, size = 9, binary.BigEndian.Uint64(hdr[1:])
	}
	if hdr[0]&^flagLong != flagCommand || size > maxCommand {
		return nil, errors.New("first frame is not a command")
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return nil, err
	}
	if name, md, ok := parseCommand(body); !ok || name != "READY" || !validMetadata(md) {
		return nil, errors.New("first command is not a valid READY")
	}
	pre = append(pre, hdr[:hl]...)
	return append(pre, body...), nil
}
