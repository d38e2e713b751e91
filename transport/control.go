package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/uuid"

	"github.com/ecxfer/ecxfer/xfer"
)

// Heartbeat and liveness defaults: the reference's ZMTP options.
const (
	defaultPingInterval = 2 * time.Second
	defaultPeerTimeout  = 8 * time.Second // the reference's HEARTBEAT_TTL
)

var discardLog = log.New(io.Discard, "", 0)

// ControlStats counts what a control-plane endpoint dropped and did.
type ControlStats struct {
	Received, Sent           uint64 // messages handed to the application; sent
	Malformed, SendFails     uint64 // messages with the wrong envelope, dropped; sends that failed
	Dropped                  uint64 // connections the guard closed (caps, silence, stalls, bad handshakes)
	Accepted, Shed           uint64 // connections a server accepted; closed or refused at MaxConns or MaxConnsPerHost
	SameHost, SameHostFailed uint64 // moves to a producer's same-host socket (server: hellos proven); offers, hellos refused
	ReadInWait               uint64 // client: replies its waiting loop read itself, waking no other goroutine
}

type controlCounters struct {
	received, sent, malformed, dropped, sendFails, accepted, shed atomic.Uint64
	sameHost, sameHostFailed, readInWait                          atomic.Uint64
	throttled                                                     atomic.Uint64 // a client's waits for Drain to make room (admit); tests
}

func (c *controlCounters) snapshot() ControlStats {
	return ControlStats{Received: c.received.Load(), Sent: c.sent.Load(), Malformed: c.malformed.Load(),
		SendFails: c.sendFails.Load(), Dropped: c.dropped.Load(), Accepted: c.accepted.Load(), Shed: c.shed.Load(),
		SameHost: c.sameHost.Load(), SameHostFailed: c.sameHostFailed.Load(), ReadInWait: c.readInWait.Load()}
}

// ---- server ----

// ServerConfig configures a Server. Zero fields take defaults.
type ServerConfig struct {
	MaxFrame                  int           // largest frame accepted; default 64 KiB
	WriteTimeout              time.Duration // a consumer not reading for this long is cut off; default 1 s
	PingInterval, PeerTimeout time.Duration // defaults 2 s, 8 s: a connection silent for PeerTimeout is closed
	HandshakeTimeout          time.Duration // default 5 s
	MaxPending                int           // handshakes in progress at once; default 256
	MaxQueued                 int           // requests and replies queued; default 4096
	MaxQueuedBytes            int           // requests waiting for Drain, replies to one consumer (16× for all); default 16 MiB
	MaxConns, MaxConnsPerHost int           // connections, from one host; the one longest without a request is shed; defaults 4096, 256
	NoSameHost                bool          // offer Go consumers on this host no Unix-domain socket (Linux; see SameHost in ControlStats)
	Logger                    *slog.Logger
}

// Server is the producer's control plane: a ZeroMQ ROUTER.
type Server struct {
	sock   zmq4.Socket
	forget func()
	log    *slog.Logger
	in     chan xfer.Message
	done   chan struct{}
	// The bytes of the requests in in (each its length + 64), bounded by
	// maxIn: past it a connection's reader waits for room, as when in is
	// full; Drain makes room and hands it on through room.
	inBytes atomic.Int64
	maxIn   int64
	room    chan struct{}
	guards  *goGroup
	gcfg    *guardConfig
	stats   controlCounters
	once    sync.Once

	connMu sync.Mutex
	conns  map[string]*guardConn // by the identity replies are routed to
	// seq orders connections by their last request, for shedding.
	seq atomic.Uint64

	// kick wakes Wait. Nothing ever waits on in itself: a request handed to
	// a waiting receiver would wake it even when onRequest has already
	// served that request.
	kick      chan struct{}
	onRequest atomic.Pointer[func()]

	steps   stepReads
	got     []xfer.Message // what Drain's reads took, under steps.mu
	replies *replyBudget
}

// Listen binds a ROUTER on "tcp://host:port" or "host:port" (port 0: any),
// or "ipc://path" (a Unix-domain socket; "ipc://@name": Linux's abstract one).
func Listen(addr string, cfg ServerConfig) (*Server, error) {
	e, err := parseEndpoint(addr)
	if err != nil {
		return nil, err
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = 64 << 10
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = time.Second
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 4096
	}
	if cfg.MaxQueuedBytes <= 0 {
		cfg.MaxQueuedBytes = 16 << 20
	}
	cfg.MaxQueuedBytes = min(cfg.MaxQueuedBytes, 1<<40) // 16 times it must not overflow
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 4096
	}
	if cfg.MaxConnsPerHost <= 0 {
		cfg.MaxConnsPerHost = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{log: cfg.Logger, in: make(chan xfer.Message, cfg.MaxQueued), done: make(chan struct{}),
		conns: map[string]*guardConn{}, kick: make(chan struct{}, 1),
		maxIn: int64(cfg.MaxQueuedBytes), room: make(chan struct{}, 1)}
	gcfg := newGuardConfig(uint64(cfg.MaxFrame), cfg.WriteTimeout, cfg.PingInterval, cfg.PeerTimeout,
		cfg.HandshakeTimeout, 0, cfg.MaxPending, &s.stats)
	gcfg.deliver, gcfg.ready, gcfg.gone, gcfg.maxOut = s.deliver, s.connected, s.disconnected, cfg.MaxQueued
	gcfg.steps, gcfg.take = &s.steps, s.take
	s.replies = newReplyBudget(cfg.MaxQueuedBytes, 16*cfg.MaxQueuedBytes)
	gcfg.replies = s.replies
	gcfg.maxConns, gcfg.maxConnsPerHost, gcfg.seq = cfg.MaxConns, cfg.MaxConnsPerHost, &s.seq
	gcfg.onShed = func() { s.stats.shed.Add(1) }
	gcfg.local = !cfg.NoSameHost
	gcfg.onLocal = func(ok bool) {
		if ok {
			s.stats.sameHost.Add(1)
		} else {
			s.stats.sameHostFailed.Add(1)
		}
	}
	ep, forget, err := guardEndpoint(gcfg, e)
	if err != nil {
		return nil, err
	}
	s.guards = gcfg.group
	s.gcfg = gcfg
	s.forget = forget
	s.sock = zmq4.NewRouter(context.Background(), zmq4.WithLogger(discardLog), zmq4.WithTimeout(cfg.WriteTimeout))
	if err := s.sock.Listen(ep); err != nil {
		forget()
		s.sock.Close()
		return nil, listenErr(addr, ep, err)
	}
	return s, nil
}

func newGuardConfig(maxFrame uint64, write, ping, peer, handshake, connect time.Duration, pending int, st *controlCounters) *guardConfig {
	g := &guardConfig{maxFrame: maxFrame, maxFrames: 8, pingInterval: ping, peerTimeout: peer,
		writeTimeout: write, handshakeTimeout: handshake, connectTimeout: connect, maxPending: pending,
		onDrop: func(string) { st.dropped.Add(1) }, onAccept: func() { st.accepted.Add(1) }, group: new(goGroup)}
	if g.pingInterval <= 0 {
		g.pingInterval = defaultPingInterval
	}
	if g.peerTimeout <= 0 {
		g.peerTimeout = defaultPeerTimeout
	}
	if g.handshakeTimeout <= 0 {
		g.handshakeTimeout = 5 * time.Second
	}
	if g.connectTimeout <= 0 {
		g.connectTimeout = 8 * time.Second
	}
	if g.maxPending <= 0 {
		g.maxPending = 256
	}
	return g
}

// Addr returns the bound address.
func (s *Server) Addr() net.Addr { return s.sock.Addr() }

// Endpoint returns the bound address: "tcp://host:port" or "ipc://path".
func (s *Server) Endpoint() string { return endpointOf(s.Addr()) }

// Stats returns the counters.
func (s *Server) Stats() ControlStats { return s.stats.snapshot() }

// connected routes replies for g's identity to g: the peer's Identity
// property, or one made up when it sent none (as zmq4 and libzmq do). A
// second connection presenting an identity in use takes it over and the
// first is closed (libzmq's ROUTER_HANDOVER): a consumer that reconnects
// before its old connection timed out is not black-holed.
func (s *Server) connected(g *guardConn) {
	s.connMu.Lock()
	// Under connMu: a Close racing the handshake reads it in disconnected.
	if len(g.identity) == 0 {
		g.identity = []byte(uuid.NewString())
	}
	// Counted before it can be replied to: a reply finds it registered.
	g.cfg.replies.register(g)
	old := s.conns[string(g.identity)]
	s.conns[string(g.identity)] = g
	s.connMu.Unlock()
	if old != nil {
		old.Close()
	}
	select {
	case <-g.done:
		// Closed before it was routed to: disconnected may have run
		// first, and must not leave it routed to or counted.
		s.disconnected(g)
	default:
	}
}

func (s *Server) disconnected(g *guardConn) {
	s.connMu.Lock()
	if s.conns[string(g.identity)] == g {
		delete(s.conns, string(g.identity))
	}
	s.connMu.Unlock()
	g.cfg.replies.drop(g)
}

// deliver takes one request off a connection: ["", payload] from a DEALER.
// A full queue holds the connection's reader (TCP backpressure on that
// consumer) until Drain makes room. Then onRequest runs here, and Wait is
// woken only for what it left in the queue.
func (s *Server) deliver(g *guardConn, frames [][]byte) bool {
	if len(frames) != 2 || len(frames[0]) != 0 {
		s.stats.malformed.Add(1)
		return true
	}
	g.lastMsg.Store(s.seq.Add(1))
	m := xfer.Message{Identity: g.identity, Payload: frames[1]}
	if !s.reserveIn(g, inCost(m)) {
		return false
	}
	select {
	case s.in <- m:
	default:
		s.wake()
		select {
		case s.in <- m:
		case <-g.done:
			s.freeIn(inCost(m))
			return false
		case <-s.done:
			s.freeIn(inCost(m))
			return false
		}
	}
	if f := s.onRequest.Load(); f != nil {
		(*f)()
	}
	if len(s.in) > 0 {
		s.wake()
	}
	return true
}

// inCost is what a request counts against maxIn.
func inCost(m xfer.Message) int64 { return int64(len(m.Payload)) + 64 }

// reserveIn counts n bytes of a request for in, first waiting, with g's
// reader held, until they fit or none are counted; false if g or the
// server closed meanwhile.
func (s *Server) reserveIn(g *guardConn, n int64) bool {
	waited := false
	for {
		b := s.inBytes.Load()
		if b > 0 && b+n > s.maxIn {
			s.wake() // a Drain makes room
			select {
			case <-s.room:
				waited = true
				continue
			case <-g.done:
				return false
			case <-s.done:
				return false
			}
		}
		if s.inBytes.CompareAndSwap(b, b+n) {
			if waited && b+n < s.maxIn {
				s.handOnRoom() // to the next reader waiting, if any
			}
			return true
		}
	}
}

// freeIn gives back n bytes of in and wakes a reader waiting for room.
func (s *Server) freeIn(n int64) {
	s.inBytes.Add(-n)
	s.handOnRoom()
}

// handOnRoom wakes one reader waiting for room, if one waits; that one
// hands it on while room is left.
func (s *Server) handOnRoom() {
	select {
	case s.room <- struct{}{}:
	default:
	}
}

// take takes one request a Drain read: as deliver, for Drain's caller.
func (s *Server) take(g *guardConn, frames [][]byte) bool {
	if len(frames) != 2 || len(frames[0]) != 0 {
		s.stats.malformed.Add(1)
		return true
	}
	g.lastMsg.Store(s.seq.Add(1))
	s.stats.received.Add(1)
	s.steps.taken.Add(1)
	s.got = append(s.got, xfer.Message{Identity: g.identity, Payload: frames[1]})
	return true
}

// wake makes the Wait in progress, or else the next one, return true.
func (s *Server) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// onRequestHook sets f (nil: none) to run on a connection's reader goroutine
// each time a request from it is queued, before Wait is woken for it. If f
// drains the queue (connector.Producer steps there while it serves), the
// request is answered without waking another goroutine: on a small
// machine that hand-off costs more than the round trip. f must not block;
// that connection's next request waits for it.
func (s *Server) onRequestHook(f func()) {
	if f == nil {
		s.onRequest.Store(nil)
		return
	}
	s.onRequest.Store(&f)
}

// Drain appends the requests received since the last call to dst.
func (s *Server) Drain(dst []xfer.Message) []xfer.Message {
	s.steps.drained()
	s.steps.mu.Lock()
	defer s.steps.mu.Unlock()
	var freed int64
	for {
		select {
		case m := <-s.in:
			s.stats.received.Add(1)
			dst = append(dst, m)
			freed += inCost(m)
			continue
		default:
		}
		break
	}
	if freed > 0 {
		s.freeIn(freed)
	}
	// Then what the busy connections' sockets have (see stepReads): after
	// the queue, which holds what each of them delivered before.
	s.got = dst
	s.steps.readLocked()
	dst, s.got = s.got, nil
	return dst
}

// Wait blocks until a request waits for Drain (true) or ctx ends.
func (s *Server) Wait(ctx context.Context) bool { return s.waitOr(ctx, nil, nil) }

// waitOr is Wait that also returns, true, when ready or timeout receives,
// so that a producer's loop waits on requests and its data plane's
// notifications at once without a goroutine (connector.Producer uses it).
// It returns false once the server is closed.
func (s *Server) waitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool {
	if len(s.in) > 0 {
		return true
	}
	defer s.steps.wait()()
	select {
	case <-s.kick:
		return true
	case <-ready:
		return true
	case <-timeout:
		return true
	case <-ctx.Done():
		return false
	case <-s.done:
		return false
	}
}

// Reply queues payload for consumer identity; it fails with xfer.ErrPeerDown
// (no such connection), xfer.ErrQueueFull, or xfer.ErrClosed.
func (s *Server) Reply(identity, payload []byte) error {
	select {
	case <-s.done:
		return xfer.ErrClosed
	default:
	}
	s.connMu.Lock()
	g := s.conns[string(identity)]
	s.connMu.Unlock()
	if g == nil {
		s.stats.sendFails.Add(1)
		return fmt.Errorf("%w: no consumer with identity %q", xfer.ErrPeerDown, identity)
	}
	if err := g.send(nil, payload); err != nil {
		s.stats.sendFails.Add(1)
		if errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("%w: %v", xfer.ErrPeerDown, err)
		}
		return err
	}
	s.stats.sent.Add(1)
	return nil
}

// Close stops the server and waits for its goroutines.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.sock.Close()
		s.guards.wait() // the guard's accept loop, handshakes and heartbeats
		s.forget()
	})
	return err
}

// ---- client ----

// ClientConfig configures a Client. Zero fields take defaults.
type ClientConfig struct {
	MaxFrame                         int                        // largest frame, and bytes of one producer's replies waiting for Drain; default 64 MiB
	ConnectTimeout, HandshakeTimeout time.Duration              // defaults 8 s, 8 s
	WriteTimeout                     time.Duration              // a producer not reading for this long is cut off; default 5 s
	PingInterval, PeerTimeout        time.Duration              // defaults 2 s, 8 s: a producer silent for PeerTimeout is dead
	MaxQueued                        int                        // requests queued per producer; default 1024
	Allow                            func(hostport string) bool // producers that may be dialed (host:port, or an "ipc://" endpoint whole); nil: all. Set it if addresses come from requests
	NoSameHost                       bool                       // stay on TCP with Go producers on this host instead of moving to their Unix-domain socket
	Logger                           *slog.Logger
}

// Client is the consumer's control plane: a DEALER per producer address.
type Client struct {
	cfg   ClientConfig
	gcfg  *guardConfig
	log   *slog.Logger
	stats controlCounters
	wg    sync.WaitGroup

	mu    sync.Mutex
	peers map[string]*dealer
	dead  []*dealer // declared dead, not yet reported by Dead
	// down holds the addresses whose last connection died and that no
	// connection reached since: a death there is not news, and is logged
	// at Debug, so a dead producer that a loop keeps dialing logs once.
	down   map[string]bool
	closed bool
	queue  []inbound     // delivered, for the next Drain (see admit)
	wake   chan struct{} // something was queued, or a producer died

	steps stepReads
	got   []inbound // what Drain's reads took, under steps.mu
	obuf  []byte    // the owner's own wait's reads (waitOwn)
}

// NewClient returns a client.
func NewClient(cfg ClientConfig) *Client {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = 64 << 20
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 5 * time.Second
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 8 * time.Second
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, log: cfg.Logger, peers: map[string]*dealer{},
		down: map[string]bool{}, wake: make(chan struct{}, 1)}
	c.gcfg = newGuardConfig(uint64(cfg.MaxFrame), cfg.WriteTimeout, cfg.PingInterval, cfg.PeerTimeout,
		cfg.HandshakeTimeout, cfg.ConnectTimeout, 0, &c.stats)
	c.gcfg.steps = &c.steps
	c.steps.wakeOwner = func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	return c
}

// Stats returns the counters.
func (c *Client) Stats() ControlStats { return c.stats.snapshot() }

type dealer struct {
	c     *Client
	addr  string
	ep    endpoint
	stop  chan struct{}
	up    chan struct{}         // closed once the handshake is done
	err   atomic.Pointer[error] // why it died, for Connect
	qmu   sync.Mutex
	early [][]byte   // sent before the connection was up
	g     *guardConn // once the handshake is done
	dead  atomic.Bool
	once  sync.Once
	sockM sync.Mutex
	sock  zmq4.Socket
	conn  net.Conn      // the guarded connection, once dialed
	took  time.Duration // the dial and handshake, set before up closes
	upAt  time.Time     // when the handshake was done, set before up closes

	// The same-host channel (local.go). tcp is the first connection;
	// local, under qmu, the proven Unix-domain one until a send moves to
	// it (g), which it does once no request sent on tcp is unanswered
	// (outstanding). lsock and lconn are its socket and connection until
	// then, under sockM; retired is tcp once closed on purpose.
	tcp          atomic.Pointer[guardConn]
	local        *guardConn
	moved        bool // under qmu
	outstanding  atomic.Int64
	asked, taken atomic.Bool
	offer        chan struct{} // closed once an offer is taken
	settled      chan struct{} // closed once the move is ready or failed
	lsock        zmq4.Socket
	lconn        net.Conn
	retired      atomic.Pointer[guardConn]

	// The replies delivered and not yet drained, bounded (see admit).
	queued, queuedBytes atomic.Int64
	room                chan struct{} // a Drain took some of them
}

// Send queues a copy of payload for addr, dialing it if needed; it fails with
// xfer.ErrQueueFull, xfer.ErrNotAllowed, or xfer.ErrPeerDown until Dead.
func (c *Client) Send(addr string, payload []byte) error {
	d, err := c.dealerFor(addr)
	if err != nil {
		return err
	}
	// Not under c.mu: a send that finds the connection broken closes it,
	// and the death is reported under c.mu.
	return d.send(payload)
}

// Connect dials addr, awaiting the handshake and any same-host move.
func (c *Client) Connect(ctx context.Context, addr string) error {
	d, err := c.dealerFor(addr)
	if err != nil {
		return err
	}
	select {
	case <-d.up:
		d.awaitMove(ctx)
		return nil
	case <-d.stop:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-d.up: // up, then removed
		return nil
	default:
	}
	if err := d.err.Load(); err != nil {
		return fmt.Errorf("%w: %s: %v", xfer.ErrPeerDown, addr, *err)
	}
	return fmt.Errorf("%w: %s: removed or closed while connecting", xfer.ErrClosed, addr)
}

// dealerFor returns the live DEALER for addr, starting one if there is
// none.
func (c *Client) dealerFor(addr string) (*dealer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, xfer.ErrClosed
	}
	d := c.peers[addr]
	if d != nil && d.dead.Load() {
		return nil, fmt.Errorf("%w: %s", xfer.ErrPeerDown, addr)
	}
	if d == nil {
		e, err := parseEndpoint(addr)
		if err != nil {
			return nil, err
		}
		allowed := e.addr // host:port
		if e.network == "unix" {
			allowed = e.String()
		}
		if c.cfg.Allow != nil && !c.cfg.Allow(allowed) {
			return nil, fmt.Errorf("%w: %s", xfer.ErrNotAllowed, addr)
		}
		d = &dealer{c: c, addr: addr, ep: e, stop: make(chan struct{}), up: make(chan struct{}), room: make(chan struct{}, 1),
			offer: make(chan struct{}), settled: make(chan struct{})}
		c.peers[addr] = d
		c.wg.Add(1)
		go d.run()
	}
	return d, nil
}

// send writes payload on the connection, or keeps a copy until it is up.
func (d *dealer) send(payload []byte) error {
	d.qmu.Lock()
	g := d.g
	if g == nil {
		defer d.qmu.Unlock()
		if len(d.early) >= d.c.cfg.MaxQueued {
			return fmt.Errorf("%w: %s", xfer.ErrQueueFull, d.addr)
		}
		d.early = append(d.early, append([]byte(nil), payload...))
		return nil
	}
	var retire *guardConn
	if d.local != nil && d.outstanding.Load() == 0 {
		select {
		case <-d.local.done: // closed, its end not yet told: stay
			d.local = nil
		default:
			retire, g = g, d.local
			d.g, d.local, d.moved = g, nil, true
			d.retired.Store(retire)
		}
	}
	counted := !d.moved
	if counted {
		d.outstanding.Add(1)
	}
	d.qmu.Unlock()
	if retire != nil {
		d.retire()
	}
	if err := g.send(nil, payload); err != nil {
		if counted {
			d.uncount()
		}
		d.c.stats.sendFails.Add(1)
		if errors.Is(err, xfer.ErrQueueFull) {
			return fmt.Errorf("%w: %s", xfer.ErrQueueFull, d.addr)
		}
		return fmt.Errorf("%w: %s: %v", xfer.ErrPeerDown, d.addr, err)
	}
	d.c.stats.sent.Add(1)
	return nil
}

// inbound is a payload and the DEALER it came on.
type inbound struct {
	xfer.Inbound
	d *dealer
}

// Drain appends the payloads received since the last call to dst.
func (c *Client) Drain(dst []xfer.Inbound) []xfer.Inbound {
	c.steps.drained()
	c.steps.mu.Lock()
	defer c.steps.mu.Unlock()
	c.mu.Lock()
	for _, m := range c.queue {
		m.d.drained(len(m.Payload))
		dst = c.take(dst, m)
	}
	clear(c.queue)
	c.queue = c.queue[:0]
	if len(c.dead) == 0 { // the token was for what was just taken
		select {
		case <-c.wake:
		default:
		}
	}
	c.mu.Unlock()
	// Then what the busy connections' sockets have (see stepReads): after
	// the queue, which holds what each of them delivered before. Not under
	// mu: a connection that fails reports its death under it.
	c.steps.readLocked()
	if len(c.got) > 0 {
		c.mu.Lock()
		for _, m := range c.got {
			dst = c.take(dst, m)
		}
		c.mu.Unlock()
		clear(c.got)
		c.got = c.got[:0]
	}
	return dst
}

// take appends m to dst if its DEALER is still its address's; under mu.
func (c *Client) take(dst []xfer.Inbound, m inbound) []xfer.Inbound {
	if c.peers[m.d.addr] != m.d {
		c.stats.dropped.Add(1)
		return dst
	}
	c.stats.received.Add(1)
	return append(dst, m.Inbound)
}

// Wait blocks until a payload or a death waits (true) or ctx ends.
func (c *Client) Wait(ctx context.Context) bool { return c.waitOr(ctx, nil, nil) }

// waitOr is Wait that also returns, true, when ready or timeout receives,
// so that a loop waits on the control plane and a data plane at once
// without a goroutine (connector.Pool uses it).
func (c *Client) waitOr(ctx context.Context, ready <-chan struct{}, timeout <-chan time.Time) bool {
	c.mu.Lock()
	n := len(c.queue) + len(c.dead)
	c.mu.Unlock()
	if n > 0 {
		return true
	}
	defer c.steps.wait()()
	select {
	case <-c.wake:
		return true
	case <-ready:
		return true
	case <-timeout:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitOwn is waitOr for a loop that waits between its steps, when one
// connection is busy (stepReads.mine): the waiting goroutine reads it
// itself, in Go's poller, until a message came whole, d passed (d < 0:
// no limit), ctx ended (false), or anything else is for the loop: a
// reply on another connection, a death, Close, or the data plane's
// signal, whose hook calls interrupt (ready is checked only before the
// read). ok false: there is no such connection, and nothing was waited.
func (c *Client) waitOwn(ctx context.Context, ready <-chan struct{}, d time.Duration) (woke, ok bool) {
	c.mu.Lock()
	n, closed := len(c.queue)+len(c.dead), c.closed
	c.mu.Unlock()
	switch {
	case n > 0:
		return true, true
	case closed:
		return false, false
	}
	st := &c.steps
	g := st.holdOwn()
	if g == nil {
		return false, false
	}
	// Deferred in this order: the read's deadline is gone before
	// waitedOwn hands the connection back to its goroutine, if it does.
	defer st.waitedOwn()
	var dl time.Time
	if d >= 0 {
		dl = time.Now().Add(d)
	}
	// The data plane's signal ended the wait, or may have come with what
	// did: its token is taken here, as a wait on ready takes it, or the
	// next wait would return at once for a step with nothing to do.
	defer func() {
		select {
		case <-ready:
		default:
		}
	}()
	if !st.startReading(g, dl) {
		return ctx.Err() == nil, true // interrupted before the read began
	}
	defer st.stopReading(g)
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, st.interrupt)()
	}
	// What came before the read could be interrupted.
	if c.pending() {
		return true, true
	}
	select {
	case <-ready:
		return true, true
	default:
	}
	if ctx.Err() != nil {
		return false, true
	}
	if c.obuf == nil {
		c.obuf = make([]byte, 16<<10)
	}
	for {
		n, err := g.Conn.Read(c.obuf)
		if st.afterRead != nil {
			st.afterRead(g)
		}
		if n > 0 {
			g.received(n)
			g.smu.Lock()
			g.empty = 0
			g.sink = g.cfg.own
			was := g.sunk
			ferr := g.feed(c.obuf[:n])
			delivered, big := g.sunk != was, len(g.in) > readChunk
			g.smu.Unlock()
			if ferr != nil || big {
				st.handBack() // its goroutine sees the same, or reads the frame
				return true, true
			}
			if delivered {
				return true, true
			}
		}
		switch {
		case err == nil:
			continue // a command, or part of a message
		case errors.Is(err, os.ErrDeadlineExceeded):
			return ctx.Err() == nil, true
		default:
			st.handBack() // its goroutine sees the same, and reports it
			return true, true
		}
	}
}

// pending says whether a payload or a death waits for the loop.
func (c *Client) pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)+len(c.dead) > 0
}

// Dead appends the producers declared dead since the last call, and why.
func (c *Client) Dead(dst []xfer.Death) []xfer.Death {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, d := range c.dead {
		if c.peers[d.addr] == d {
			delete(c.peers, d.addr)
			var err error = errConnClosed
			if e := d.err.Load(); e != nil {
				err = *e
			}
			dst = append(dst, xfer.Death{Addr: d.addr, Err: err})
		}
		c.dead[i] = nil
	}
	c.dead = c.dead[:0]
	return dst
}

// Remove drops the DEALER for addr, if any, without reporting it dead.
func (c *Client) Remove(addr string) {
	c.mu.Lock()
	d := c.peers[addr]
	delete(c.peers, addr)
	c.mu.Unlock()
	if d != nil {
		d.shutdown()
	}
}

// Close drops every DEALER and waits for their goroutines.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	peers := c.peers
	c.peers = map[string]*dealer{}
	c.mu.Unlock()
	c.steps.interrupt()
	for _, d := range peers {
		d.shutdown()
	}
	c.wg.Wait()
	c.gcfg.group.wait() // the guard's heartbeats
	return nil
}

func (d *dealer) shutdown() {
	d.once.Do(func() { close(d.stop) })
	d.sockM.Lock()
	if d.conn != nil {
		d.conn.Close() // ends a handshake zmq4's Close would wait out
	}
	if d.sock != nil {
		d.sock.Close()
	}
	if d.lconn != nil {
		d.lconn.Close()
	}
	if d.lsock != nil {
		d.lsock.Close()
	}
	d.sockM.Unlock()
}

// die declares the producer dead, once, and reports it.
func (d *dealer) die(err error) {
	if !d.dead.CompareAndSwap(false, true) {
		return
	}
	select {
	case <-d.stop: // removed or closed on purpose: not a death
		return
	default:
	}
	d.err.Store(&err)
	d.c.mu.Lock()
	if d.c.peers[d.addr] == d {
		d.c.dead = append(d.c.dead, d)
	}
	news := !d.c.down[d.addr]
	if news && len(d.c.down) < maxDown {
		d.c.down[d.addr] = true
	}
	d.c.mu.Unlock()
	level := slog.LevelDebug
	if news {
		level = slog.LevelWarn
	}
	d.c.log.Log(context.Background(), level, "ec control: producer declared dead", "addr", d.addr, "err", err)
	select {
	case d.c.wake <- struct{}{}:
	default:
	}
	d.c.steps.interrupt()
	d.shutdown()
}

func (d *dealer) run() {
	defer d.c.wg.Done()
	gcfg := *d.c.gcfg
	gcfg.gone = func(g *guardConn) {
		if d.retired.Load() != g {
			d.die(g.cause())
		}
	}
	gcfg.onOffer = d.offered
	start := time.Now()
	g, err := d.dial(gcfg, d.ep, d.addr, &d.sock, &d.conn)
	if err != nil {
		d.die(err)
		return
	}
	if g == nil { // stopped while dialing
		return
	}
	// The handshake is done (zmq4's Dial returns after it): what was sent
	// meanwhile goes first, in order, then Send writes directly.
	d.tcp.Store(g)
	d.qmu.Lock()
	early := d.early
	d.early = nil
	for _, p := range early {
		d.outstanding.Add(1)
		if err := g.send(nil, p); err != nil {
			d.c.stats.sendFails.Add(1)
			break // the connection closed: the death is reported
		}
		d.c.stats.sent.Add(1)
	}
	d.g = g
	d.qmu.Unlock()
	d.upAt = time.Now()
	d.took = d.upAt.Sub(start)
	if !d.c.cfg.NoSameHost && localSupported && d.ep.network == "tcp" && reachesThisHost(g.LocalAddr(), g.RemoteAddr()) {
		d.asked.Store(true)
		g.sendCommand(ctlLocal, localQuery)
	}
	d.c.mu.Lock()
	back := d.c.down[d.addr]
	delete(d.c.down, d.addr)
	d.c.mu.Unlock()
	if back {
		d.c.log.Info("ec control: producer reachable again", "addr", d.addr)
	}
	close(d.up)
}

// maxDown bounds the addresses a Client remembers as down: past it, a
// death at another address is logged as news every time.
const maxDown = 4096

// plainErr is a failed dial's or listen's error as the user sees it: the
// address they gave, not the guard's internal one, with the cause still
// reachable (errors.Is(err, syscall.ECONNREFUSED)).
type plainErr struct {
	msg string
	err error
}

func (e *plainErr) Error() string { return e.msg }

// listenErr says why Listen failed: the network's error where there is
// one, without zmq4's words around it, which name the guard's endpoint.
func listenErr(addr, ep string, err error) error {
	why := strings.ReplaceAll(err.Error(), ep, addr)
	var op *net.OpError
	if errors.As(err, &op) {
		why = op.Error()
	}
	return &plainErr{msg: "transport: listen " + addr + ": " + why, err: err}
}
func (e *plainErr) Unwrap() error { return e.err }

// take takes one reply a Drain read: as deliver, for Drain's caller.
func (d *dealer) take(g *guardConn, frames [][]byte) bool {
	if len(frames) != 2 || len(frames[0]) != 0 {
		d.c.stats.malformed.Add(1)
		return true
	}
	d.c.steps.taken.Add(1)
	if g == d.c.steps.mine { // under steps.mu, as Drain's reads are
		d.c.steps.misses.Store(0)
	}
	d.c.got = append(d.c.got, inbound{xfer.Inbound{Addr: d.addr, Payload: frames[1]}, d})
	d.answered(g)
	return true
}

// deliver takes one reply off the connection: ["", payload] from a ROUTER.
func (d *dealer) deliver(g *guardConn, frames [][]byte) bool {
	if len(frames) != 2 || len(frames[0]) != 0 {
		d.c.stats.malformed.Add(1)
		return true
	}
	if !d.admit(g, len(frames[1])) {
		return false
	}
	d.queue(g, frames[1])
	d.c.steps.interrupt() // a loop that reads another connection itself
	return true
}

// queue hands an admitted reply to Drain and wakes a wait; under g.smu.
func (d *dealer) queue(g *guardConn, payload []byte) {
	d.c.mu.Lock()
	d.c.queue = append(d.c.queue, inbound{xfer.Inbound{Addr: d.addr, Payload: payload}, d})
	d.c.mu.Unlock()
	g.sunk++
	d.answered(g) // only once queued: a reply waiting for room holds the move
	select {
	case d.c.wake <- struct{}{}: // the loop's, or a wait beside the loop's own
	default:
	}
}

// ownDeliver is deliver for the owner's own wait, which reads only while
// nothing waits for Drain and returns with what it read: a reply is
// counted as admitted without waiting for room (the wait read at most a
// buffer's worth).
func (d *dealer) ownDeliver(g *guardConn, frames [][]byte) bool {
	if len(frames) != 2 || len(frames[0]) != 0 {
		d.c.stats.malformed.Add(1)
		return true
	}
	d.queued.Add(1)
	d.queuedBytes.Add(int64(len(frames[1])))
	d.c.stats.readInWait.Add(1)
	d.c.steps.misses.Store(0)
	d.queue(g, frames[1])
	return true
}

// maxWaiting bounds the replies of one producer waiting for Drain.
const maxWaiting = 4096

// admit counts a reply of n bytes as waiting for Drain, once that leaves
// the producer's replies waiting within maxWaiting and MaxFrame bytes (a
// reply is always admitted when none waits). Until then the connection
// is not read: a producer that sends faster than the consumer drains holds
// at most that much of the consumer's memory, beside the frame being
// read, and its own connection waits, never a neighbour's; not drained
// for the peer timeout, it is declared silent.
func (d *dealer) admit(g *guardConn, n int) bool {
	for {
		q, b := d.queued.Load(), d.queuedBytes.Load()
		if q == 0 || q < maxWaiting && b+int64(n) <= int64(d.c.cfg.MaxFrame) {
			break
		}
		d.c.stats.throttled.Add(1)
		select {
		case <-d.room:
		case <-d.stop:
			return false
		case <-g.done:
			return false
		}
	}
	d.queued.Add(1)
	d.queuedBytes.Add(int64(n))
	return true
}

// drained counts a reply admitted (deliver) as taken by Drain.
func (d *dealer) drained(n int) {
	d.queued.Add(-1)
	d.queuedBytes.Add(-int64(n))
	select {
	case d.room <- struct{}{}:
	default:
	}
}

// answered counts a reply on the TCP connection, queued for Drain,
// against the requests unanswered there (never below none: a producer may
// answer twice).
func (d *dealer) answered(g *guardConn) {
	if g == d.tcp.Load() {
		d.uncount()
	}
}

// uncount takes one from outstanding, never below zero.
func (d *dealer) uncount() {
	for {
		n := d.outstanding.Load()
		if n <= 0 || d.outstanding.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// offered takes a server's same-host offer, on the TCP connection, once,
// if we asked, and proves and dials it on a goroutine of the guard's.
func (d *dealer) offered(g *guardConn, body []byte) {
	if !d.asked.Load() || g != d.tcp.Load() || !d.taken.CompareAndSwap(false, true) {
		return
	}
	close(d.offer)
	o, ok := parseLocalOffer(body)
	if !ok {
		d.c.stats.sameHostFailed.Add(1)
		d.c.log.Debug("ec control: malformed same-host offer ignored", "addr", d.addr)
		close(d.settled)
		return
	}
	addr := g.RemoteAddr().String()
	if !d.c.gcfg.spawn(func() { defer close(d.settled); d.upgrade(o, addr) }) {
		close(d.settled)
	}
}

// awaitMove lets Connect return with the move ready, so that the first
// fetch goes over the same-host socket: once the handshake is done, if
// the producer was asked, it waits for an offer as long as the handshake
// took (1 ms at least: a libzmq producer never offers), then for the
// move's dial and proof, or for ctx.
func (d *dealer) awaitMove(ctx context.Context) {
	if !d.asked.Load() {
		return
	}
	grace := time.NewTimer(time.Until(d.upAt.Add(max(d.took, time.Millisecond))))
	defer grace.Stop()
	select {
	case <-d.offer:
	case <-grace.C:
		return
	case <-ctx.Done():
		return
	case <-d.stop:
		return
	}
	select {
	case <-d.settled:
	case <-ctx.Done():
	case <-d.stop:
	}
}

// upgrade dials the offer's socket and proves it (proveLocal) before the
// ZMTP handshake; once up, the next send that finds no request
// unanswered on TCP moves to it. A failure leaves the dealer on TCP.
func (d *dealer) upgrade(o localOffer, addr string) {
	gcfg := *d.c.gcfg
	gcfg.pre = func(c net.Conn) error { return proveLocal(c, o, addr, d.c.cfg.HandshakeTimeout) }
	gcfg.gone = d.localGone
	g, err := d.dial(gcfg, endpoint{"unix", o.name}, o.name, &d.lsock, &d.lconn)
	if err != nil {
		d.c.stats.sameHostFailed.Add(1)
		d.c.log.Debug("ec control: same-host socket not taken; staying on TCP", "addr", d.addr, "err", err)
		d.dropLocal()
		return
	}
	if g == nil { // stopped while dialing
		return
	}
	d.qmu.Lock()
	select {
	case <-g.done: // closed already: localGone found nothing to clear
		d.qmu.Unlock()
		d.c.stats.sameHostFailed.Add(1)
		d.dropLocal()
		return
	default:
		d.local = g
	}
	d.qmu.Unlock()
	d.c.stats.sameHost.Add(1)
}

// dropLocal closes and forgets the same-host socket and connection not
// moved to (a failed handshake's connection zmq4 never took, too).
func (d *dealer) dropLocal() {
	d.sockM.Lock()
	sock, c := d.lsock, d.lconn
	d.lsock, d.lconn = nil, nil
	d.sockM.Unlock()
	if c != nil {
		c.Close()
	}
	if sock != nil {
		sock.Close()
	}
}

// dial opens a zmq4 DEALER to e through the guard, with gcfg (the
// dealer's message path added), named name in errors, keeping its socket in *sockp and its
// connection in *connp, under sockM, for shutdown to close. A nil
// connection and error: stopped before or while dialing.
func (d *dealer) dial(gcfg guardConfig, e endpoint, name string, sockp *zmq4.Socket, connp *net.Conn) (*guardConn, error) {
	gcfg.stop = d.stop
	gcfg.deliver, gcfg.take, gcfg.own, gcfg.maxOut = d.deliver, d.take, d.ownDeliver, d.c.cfg.MaxQueued
	gcfg.track = func(c net.Conn) {
		d.sockM.Lock()
		defer d.sockM.Unlock()
		select {
		case <-d.stop:
			c.Close()
		default:
			*connp = c
		}
	}
	ep, forget, err := guardEndpoint(&gcfg, e)
	if err != nil {
		return nil, err
	}
	defer forget()
	sock := zmq4.NewDealer(context.Background(), zmq4.WithID(zmq4.SocketIdentity(uuid.NewString())),
		zmq4.WithLogger(discardLog), zmq4.WithTimeout(d.c.cfg.WriteTimeout), zmq4.WithDialerMaxRetries(0))
	d.sockM.Lock()
	select {
	case <-d.stop:
		d.sockM.Unlock()
		sock.Close()
		return nil, nil
	default:
	}
	*sockp = sock
	d.sockM.Unlock()
	if err := sock.Dial(ep); err != nil {
		return nil, &plainErr{msg: "connect to " + name + ": " + strings.ReplaceAll(err.Error(), ep, name), err: err}
	}
	d.sockM.Lock()
	g, _ := (*connp).(*guardConn)
	d.sockM.Unlock()
	return g, nil
}

// localGone is told of the same-host connection's end: the producer's
// death once sends moved to it, else only the end of the offer.
func (d *dealer) localGone(g *guardConn) {
	d.qmu.Lock()
	inUse := d.g == g
	if d.local == g {
		d.local = nil
	}
	d.qmu.Unlock()
	if inUse {
		d.die(g.cause())
	}
}

// retire closes the TCP connection once sends moved to the same-host one:
// its socket becomes the one shutdown closes.
func (d *dealer) retire() {
	d.sockM.Lock()
	old := d.sock
	d.sock, d.conn = d.lsock, d.lconn
	d.lsock, d.lconn = nil, nil
	d.sockM.Unlock()
	if old != nil && !d.c.gcfg.spawn(func() { old.Close() }) {
		old.Close()
	}
}
