package transport

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ecxfer/ecxfer/cache"

	"github.com/ecxfer/ecxfer/internal/cachex"
	"github.com/ecxfer/ecxfer/internal/wireview"
	"github.com/ecxfer/ecxfer/xfer"
)

// TCPConfig configures a TCPData. Zero fields take defaults.
type TCPConfig struct {
	Name      string // agent name peers see, a label only; default "ecxfer-" + a random id
	Listen    string // address to serve READs on, e.g. "127.0.0.1:0"; empty: a consumer only
	Advertise string // address put in the metadata; default the listener's (set it for 0.0.0.0)
	// Authorize, if set, must also grant each READ (blocks nil: a notification);
	// granted blocks stay the entry's until release. Called concurrently; no same-host copy.
	Authorize                 func(agent string, notif []byte, blocks []int) (release func(), ok bool)
	IOTimeout                 time.Duration // a READ or write with no byte moved for this long fails; default 10 s
	IdleTimeout               time.Duration // closes a served connection with no traffic; default 5 min
	DialTimeout, HelloTimeout time.Duration // dial; a new connection's hello or welcome (at most IOTimeout); defaults 8 s, 5 s
	MaxConns                  int           // connections served, shared fairly by host, grantees shed last; default 1024
	MaxConnsPerHost           int           // from one remote IP address; default MaxConns/4, at least 1
	MaxQueued                 int           // READs to one peer not yet ended, past which PostRead fails; default 4096
	Conns                     int           // connections READs use to each producer; default 2
	NoSharedMemory            bool          // turns the same-host copy off, on both sides
	CopyWorkers               int           // goroutines copying a same-host READ of 2 MiB or more; default GOMAXPROCS, at most 4
	PushBuffer                int           // pushed bytes kept per producer for READs to claim; default 8 MiB, negative: none
	NoPush                    bool          // a producer never pushes, even to consumers that ask
	Logger                    *slog.Logger  // default slog.Default()
}

func (c TCPConfig) withDefaults() TCPConfig {
	if c.IOTimeout <= 0 {
		c.IOTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 8 * time.Second
	}
	if c.HelloTimeout <= 0 {
		c.HelloTimeout = 5 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.MaxConnsPerHost <= 0 {
		c.MaxConnsPerHost = max(1, c.MaxConns/4)
	}
	if c.MaxQueued <= 0 {
		c.MaxQueued = 4096
	}
	if c.Conns <= 0 {
		c.Conns = 2
	}
	if c.PushBuffer == 0 {
		c.PushBuffer = defaultPushBuffer
	}
	c.PushBuffer = max(0, min(c.PushBuffer, 1<<30))
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// helloTimeout is how long a hello, or a welcome, may take.
func (c *TCPConfig) helloTimeout() time.Duration { return min(c.HelloTimeout, c.IOTimeout) }

// copyWorkers is how many goroutines copy a same-host READ, read now:
// GOMAXPROCS may change under a running process (Go follows a container's
// CPU limit).
func (c *TCPConfig) copyWorkers() int {
	if c.CopyWorkers > 0 {
		return c.CopyWorkers
	}
	return min(runtime.GOMAXPROCS(0), 4)
}

// agentMeta is the TCP data plane's agent metadata, msgpack-encoded into
// XferAck.agent_metadata:
//
//	{"v": 2, "name": agent name, "addr": "host:port" of its READ service,
//	 "inc": incarnation id (new on every start), "bs": block size,
//	 "n": block count}
//
// A consumer registers a producer once per blob; a new incarnation means the
// producer restarted and its blocks hold other data.
type agentMeta struct {
	Version     int    `msgpack:"v"`
	Name        string `msgpack:"name"`
	Addr        string `msgpack:"addr"`
	Incarnation string `msgpack:"inc"`
	BlockSize   int    `msgpack:"bs"`
	Blocks      int    `msgpack:"n"`
	// The same-host path, when the producer's region is Shared: the file
	// a consumer maps read-only, and where the blocks start in it.
	Shm    string `msgpack:"shm,omitempty"`
	ShmOff int    `msgpack:"shmoff,omitempty"`
	// Slots of the region header's grant table (at grantTabOff), when the
	// producer shows its live grants there.
	Grants int `msgpack:"gt,omitempty"`
	// Push: the producer pushes a grant's blocks to a consumer that asked
	// (see push.go).
	Push bool `msgpack:"push,omitempty"`
}

const (
	metaVersion = 2
	maxMetaLen  = 4096
)

// Errors of TCPData, wrapped in the errors of PostRead and AddRemotePeer.
var (
	errBusy       = errors.New("transport: too many READs queued to this peer")
	errBadMeta    = errors.New("transport: bad agent metadata")
	errBlockRange = errors.New("transport: block id out of range")
)

// TCPData is the pure-Go data plane; it serves the READs its session grants.
type TCPData struct {
	cfg    TCPConfig
	region *cache.Region
	meta   []byte
	name   string
	log    *slog.Logger
	ln     net.Listener
	wg     sync.WaitGroup
	ready  chan struct{} // a READ ended or notifications wait, for a producer's loop
	cready chan struct{} // the same, for a Pool's: neither takes the other's
	sready chan struct{} // notifications wait, for Serve's
	hooks  hookSet       // called where cready is sent (plane.SignalHooked)
	// pushPeers counts the producers whose pushes this consumer takes.
	pushPeers atomic.Int32

	mu      sync.Mutex
	closed  bool
	peers   map[string]*peer
	handles map[xfer.Handle]*readOp
	next    xfer.Handle
	notifs  []xfer.Notif
	// notifFrom[i] is the connection notifs[i] came on (its share, see
	// connNotifBytes), notifAtt[i] the attachment it is for (nil: none
	// was live; the current one takes it).
	notifFrom []*servedConn
	notifAtt  []*attachment
	// notifBytes is what the queue holds, as charged (see connNotifBytes),
	// at most notifCap (maxNotifBytes; tests lower it); waitAll: some
	// connection waits for room in it.
	notifBytes int
	notifCap   int
	waitAll    bool
	served     map[*servedConn]struct{}
	hosts      map[string]int // how many of served each remote host holds
	acceptSeq  uint64
	maps       map[regionKey]*regionMap // producers' regions this plane mapped

	// producer: the sessions attached (live, oldest first, at most
	// maxLive; att is the last, the current one), and the same-host
	// path's token and grant table in the Shared region's header
	att  atomic.Pointer[attachment]
	live atomic.Pointer[[]*attachment]
	// everAttached: a producer session attached once; from then on a
	// notification that no live session's gate routes is dropped.
	everAttached atomic.Bool
	token        []byte
	grantTab     []atomic.Uint64
	// The served connections each grant proves (by fnv1a of its
	// notification, at most maxProofConns), under pmu; clockAhead: how far
	// tests run the proofs' clock ahead.
	pmu        sync.Mutex
	proofs     map[uint64][maxProofConns]*servedConn
	clockAhead atomic.Int64

	boardCopies atomic.Uint64 // consumer: READs copied under a published grant
	// lastPost is monoNow when the last PostRead returned, its READ on its
	// way (copied, handed off or sent), whichever its producer: bursts.
	lastPost   atomic.Int64
	pushLanded atomic.Uint64 // consumer: READs landed from a push
	pushDrops  atomic.Uint64 // consumer: pushes dropped (no room, asked already, unclaimed)
	pushes     atomic.Uint64 // producer: grants pushed
	notesLost  atomic.Uint64 // consumer: notifications not sent (no connection)
	// producer: what the bounds on served connections cost their peers
	connsShed  atomic.Uint64 // connections closed at MaxConns or MaxConnsPerHost
	notifDrops atomic.Uint64 // notifications naming no live grant
	notifCuts  atomic.Uint64 // connections closed with their notifications not drained
	answersCut atomic.Uint64 // answers cut when their grant's time was up
	pushesCut  atomic.Uint64 // pushes cut when their grant's time was up
	brokenLost atomic.Uint64 // broken READs not handed over: their attachment's list was full
	beforeCopy func()        // tests: runs as a copy starts
	// steps reads the served connections that bring notifications while
	// the producer steps (see stepReads); links the consumer's connections
	// to producers while the Pool steps (see linkConn). Apart, so that a
	// producer's Serve (Serving) keeps no link from a Pool's steps.
	steps stepReads
	links stepReads
	// contactChecks counts the looks at contact READs, for tests.
	contactChecks atomic.Uint64
	// connEnded, if set, is told under mu of each accepted connection
	// that ends, refused at once or served, by its remote address (tests).
	connEnded func(remote net.Addr)
}

var _ xfer.DataTransport = (*TCPData)(nil)

// NewTCPData returns a data plane over region; it serves if cfg.Listen is set.
func NewTCPData(cfg TCPConfig, region *cache.Region) (*TCPData, error) {
	cfg = cfg.withDefaults()
	inc := uuid.NewString()
	d := &TCPData{
		cfg: cfg, region: region, log: cfg.Logger, name: cfg.Name,
		peers: map[string]*peer{}, handles: map[xfer.Handle]*readOp{}, served: map[*servedConn]struct{}{},
		maps: map[regionKey]*regionMap{}, ready: make(chan struct{}, 1), cready: make(chan struct{}, 1), sready: make(chan struct{}, 1),
		notifCap: maxNotifBytes, proofs: map[uint64][maxProofConns]*servedConn{},
	}
	if d.name == "" {
		d.name = "ecxfer-" + inc[:8]
	}
	if len(d.name) > maxNameLen {
		return nil, fmt.Errorf("transport: agent name longer than %d bytes", maxNameLen)
	}
	addr := cfg.Advertise
	if cfg.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("transport: data plane listen: %w", err)
		}
		d.ln = ln
		if addr == "" {
			addr = ln.Addr().String()
		}
	}
	m := agentMeta{Version: metaVersion, Name: d.name, Addr: addr, Incarnation: inc,
		BlockSize: region.BlockSize(), Blocks: region.Blocks(), Push: cfg.Listen != "" && !cfg.NoPush}
	if h := cachex.Header(region); h != nil && cfg.Listen != "" && !cfg.NoSharedMemory {
		d.token = h[:tokenLen:tokenLen]
		if _, err := rand.Read(d.token); err != nil {
			d.Close()
			return nil, err
		}
		m.Shm, m.ShmOff = cachex.SharedPath(region), len(h)
		if cfg.Authorize == nil && len(h) > grantTabOff {
			// With a gate of the user's every READ must go through it:
			// no board then.
			d.grantTab = unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&h[grantTabOff])), (len(h)-grantTabOff)/8)
			m.Grants = len(d.grantTab)
		}
	}
	var err error
	if d.meta, err = msgpack.Marshal(&m); err != nil {
		d.Close()
		return nil, err
	}
	if d.ln != nil {
		// Only now: a consumer that connects at once finds the token and
		// the metadata in place.
		d.wg.Add(1)
		go d.accept()
	}
	return d, nil
}

// TCPStats counts what a TCPData did and dropped.
type TCPStats struct {
	BoardCopies       uint64 // READs copied out of a same-host producer's region under a grant it showed live
	Pushed, PushDrops uint64 // READs landed from pushed blocks; pushes dropped (no room, asked already, unclaimed)
	NotesLost         uint64 // notifications of landed READs that could not be sent (the lease ends their grant)
	// As a producer (its bounds: docs/operations.md):
	PushesSent, ConnsShed uint64 // grants pushed; connections closed at MaxConns or MaxConnsPerHost
	NotifDrops, NotifCuts uint64 // notifications of no live grant or proof, dropped; connections cut, not draining theirs
	AnswersCut, PushesCut uint64 // READ answers and pushes cut once their grant's time was up
	BrokenLost            uint64 // broken READs not handed to their session (its list full): their leases end them
}

// Stats returns the counters; it is safe to call from any goroutine.
func (d *TCPData) Stats() TCPStats {
	return TCPStats{BoardCopies: d.boardCopies.Load(), Pushed: d.pushLanded.Load(), PushDrops: d.pushDrops.Load(),
		PushesSent: d.pushes.Load(), NotesLost: d.notesLost.Load(),
		ConnsShed: d.connsShed.Load(), NotifDrops: d.notifDrops.Load(), NotifCuts: d.notifCuts.Load(),
		AnswersCut: d.answersCut.Load(), PushesCut: d.pushesCut.Load(), BrokenLost: d.brokenLost.Load()}
}

// Addr returns the address READs are served on, or nil.
func (d *TCPData) Addr() net.Addr {
	if d.ln == nil {
		return nil
	}
	return d.ln.Addr()
}

// AgentMetadata implements xfer.DataTransport.
func (d *TCPData) AgentMetadata() []byte { return d.meta }

// MemDescriptor returns an empty list: the metadata has the block count.
func (d *TCPData) MemDescriptor() []byte { return emptyDescs }

// emptyDescs is msgpack's empty array, which vLLM's consumers would decode
// as no descriptors.
var emptyDescs = []byte{0x90}

// AddRemotePeer implements xfer.DataTransport; it ignores the descriptor.
func (d *TCPData) AddRemotePeer(metadata, _ []byte) (xfer.Peer, error) {
	m, err := decodeMeta(metadata, d.region.BlockSize())
	if err != nil {
		return xfer.Peer{}, err
	}
	// Producers are told apart by name, address and incarnation: two
	// producers configured with one name (replicas, demos) are two peers,
	// and a restart (a new incarnation) is a new peer, which the consumer
	// session registers after removing the old one.
	key := m.Name + "@" + m.Addr + "#" + m.Incarnation
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return xfer.Peer{}, xfer.ErrClosed
	}
	p := d.peers[key]
	if p != nil && p.blocks != m.Blocks {
		return xfer.Peer{}, fmt.Errorf("%w: %s registered with %d blocks, now %d", errBadMeta, m.Name, p.blocks, m.Blocks)
	}
	if p == nil {
		p = newPeer(d, m, key)
		d.peers[key] = p
	}
	p.refs++
	return xfer.Peer{Agent: key, Blocks: m.Blocks}, nil
}

func decodeMeta(metadata []byte, blockSize int) (agentMeta, error) {
	var m agentMeta
	if len(metadata) > maxMetaLen {
		// Ours is a few hundred bytes; a large blob could only nest deep.
		return m, fmt.Errorf("%w: %d bytes", errBadMeta, len(metadata))
	}
	// The decoder sizes what it allocates by the lengths a blob claims:
	// 14 bytes claiming a 2 GB bin took gigabytes. A blob is decoded only
	// once every length in it fits in the blob.
	if err := wireview.Whole(metadata); err != nil {
		return m, fmt.Errorf("%w: %v", errBadMeta, err)
	}
	if err := msgpack.Unmarshal(metadata, &m); err != nil {
		return m, fmt.Errorf("%w: %v", errBadMeta, err)
	}
	switch {
	case m.Version != metaVersion:
		return m, fmt.Errorf("%w: version %d", errBadMeta, m.Version)
	case m.Name == "" || len(m.Name) > maxNameLen || m.Addr == "" || len(m.Addr) > 512:
		return m, fmt.Errorf("%w: name %q addr %q", errBadMeta, m.Name, m.Addr)
	case m.BlockSize != blockSize:
		return m, fmt.Errorf("%w: block size %d, ours %d", errBadMeta, m.BlockSize, blockSize)
	case m.Blocks <= 0 || m.Blocks > 1<<31:
		return m, fmt.Errorf("%w: %d blocks", errBadMeta, m.Blocks)
	}
	return m, nil
}

// RemoveRemotePeer implements xfer.DataTransport; the last removal closes
// the peer's connections, failing the READs in flight.
func (d *TCPData) RemoveRemotePeer(agent string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.peers[agent]
	if p == nil {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	if p.refs--; p.refs == 0 {
		delete(d.peers, agent)
		p.retire(fmt.Errorf("transport: peer %s removed", agent))
	}
	return nil
}

// PostRead implements xfer.DataTransport; it also fails for an id outside a
// region, a notification over 1 KiB, or MaxQueued READs to the peer.
func (d *TCPData) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	if len(local) != len(remote) {
		return 0, xfer.ErrLengthMismatch
	}
	if len(notif) > maxNotifLen {
		return 0, fmt.Errorf("transport: notification longer than %d bytes", maxNotifLen)
	}
	for _, b := range local {
		if b < 0 || b >= d.region.Blocks() {
			return 0, fmt.Errorf("%w: local %d of %d", errBlockRange, b, d.region.Blocks())
		}
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return 0, xfer.ErrClosed
	}
	p := d.peers[agent]
	if p == nil {
		d.mu.Unlock()
		return 0, fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	for _, b := range remote {
		if b < 0 || b >= p.blocks {
			d.mu.Unlock()
			return 0, fmt.Errorf("%w: remote %d of %d", errBlockRange, b, p.blocks)
		}
	}
	if p.inflight.Add(1) > int64(d.cfg.MaxQueued) {
		p.inflight.Add(-1)
		d.mu.Unlock()
		return 0, fmt.Errorf("%w: %s", errBusy, agent)
	}
	d.next++
	op := newReadOp(d.next, p, local, remote, bytes.Clone(notif))
	d.handles[op.h] = op
	way := p.route(op) // under d.mu: p is not shut down
	d.mu.Unlock()
	p.start(op, way)
	d.lastPost.Store(monoNow())
	return op.h, nil
}

// Check implements xfer.DataTransport.
func (d *TCPData) Check(h xfer.Handle) (xfer.Progress, error) {
	d.mu.Lock()
	op := d.handles[h]
	d.mu.Unlock()
	if op == nil {
		return 0, fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	return op.progress(), nil
}

// Release implements xfer.DataTransport; stopping a READ whose bytes are
// arriving fails the READs behind it on its connection.
func (d *TCPData) Release(h xfer.Handle) error {
	d.mu.Lock()
	op := d.handles[h]
	delete(d.handles, h)
	d.mu.Unlock()
	if op == nil {
		return fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	op.release()
	return nil
}

// waited ends a wait of both sides (tcpPlane.Waiting).
func (d *TCPData) waited() {
	d.steps.waited()
	d.links.waited()
}

// signal wakes the loops waiting on the plane: a READ ended. A Pool's
// and a Producer's both hear it: one loop may step both sides.
func (d *TCPData) signal() {
	select {
	case d.ready <- struct{}{}:
	default:
	}
	select {
	case d.cready <- struct{}{}:
	default:
	}
	d.hooks.call()
}

// notify wakes the loops waiting on the plane, Serve's too: notifications
// wait.
func (d *TCPData) notify() {
	d.signal()
	select {
	case d.sready <- struct{}{}:
	default:
	}
}

// DrainNotifs implements xfer.DataTransport, for a plane no session attached.
func (d *TCPData) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) {
	d.steps.drain() // before the queue: it queues what it reads
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.takeNotifsLocked(dst, func(*attachment) bool { return true }, false), nil
}

// Close writes pending notifications (half a second at most), fails the READs
// in flight, and waits for its goroutines.
func (d *TCPData) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	// Each goes once the notifications of READs that landed are written
	// (the wait below): a consumer that closes right after its last
	// fetches would otherwise leave their grants pinned until the
	// producer's lease ends them.
	for _, p := range d.peers {
		p.retire(xfer.ErrClosed)
	}
	clear(d.peers)
	for s := range d.served {
		s.close()
	}
	d.mu.Unlock()
	for _, a := range d.liveList() {
		a.Detach()
	}
	if d.ln != nil {
		d.ln.Close()
	}
	d.wg.Wait()
	d.mu.Lock()
	for _, op := range d.handles {
		op.fail(errStopped) // one a Step was to send (viaAwait) ends with the plane too
	}
	clear(d.handles)
	d.mu.Unlock()
	return nil
}

// hookSet is a set of functions called on an event, read without a lock.
type hookSet struct {
	mu sync.Mutex
	fs atomic.Pointer[[]*func()]
}

// add adds f until remove is called.
func (h *hookSet) add(f func()) (remove func()) {
	p := &f
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.load()
	nw := append(append(make([]*func(), 0, len(old)+1), old...), p)
	h.fs.Store(&nw)
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		var kept []*func()
		for _, q := range h.load() {
			if q != p {
				kept = append(kept, q)
			}
		}
		h.fs.Store(&kept)
	}
}

func (h *hookSet) load() []*func() {
	if p := h.fs.Load(); p != nil {
		return *p
	}
	return nil
}

// call calls each function.
func (h *hookSet) call() {
	for _, f := range h.load() {
		(*f)()
	}
}

// onSignal adds f to the functions called where a Pool's channel is sent.
func (d *TCPData) onSignal(f func()) (remove func()) { return d.hooks.add(f) }
