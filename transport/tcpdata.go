package transport

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/wake"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Authorizer decides whether a READ may be served: agent is the consumer
// agent that asks (as its connection named itself), notif the READ's
// notification ("<session_id>:<mm_hash>", "#<grant>" appended by Go
// consumers), blocks the producer blocks it asks for. If it grants, the
// blocks stay the entry's until release is called, which the data plane
// does once the bytes left the region. It is called from the data plane's
// goroutines, concurrently.
type Authorizer = func(agent string, notif []byte, blocks []int) (release func(), ok bool)

// TCPConfig configures a TCPData. Zero fields take defaults.
type TCPConfig struct {
	// Name is the agent name peers see; default "ecxfer-" + a random id.
	Name string
	// Listen is the address to serve READs on, e.g. "127.0.0.1:0". Empty:
	// do not serve (a consumer only).
	Listen string
	// Advertise is the address put in the agent metadata; default the
	// listener's address. Set it when listening on 0.0.0.0.
	Advertise string
	// Authorize gates every READ served. Nil refuses every READ until
	// SetAuthorizer is called (a ProducerSession provides one).
	Authorize Authorizer
	// IOTimeout bounds each read or write once a frame or a response is
	// under way, and the wait for a response to a READ. Default 10 s.
	IOTimeout time.Duration
	// IdleTimeout closes a served connection with no traffic. Default 5 min.
	IdleTimeout time.Duration
	// DialTimeout bounds connecting to a producer. Default 8 s.
	DialTimeout time.Duration
	// MaxQueued bounds READs posted to one peer and not yet ended;
	// PostRead beyond it fails with ErrBusy. Default 4096.
	MaxQueued int
	// Conns is the number of connections to each producer; READs spread
	// over them. Default 2.
	Conns int
	// NoSharedMemory turns the same-host path off: a producer does not
	// offer its Shared region, a consumer does not map one.
	NoSharedMemory bool
	// CopyWorkers is how many goroutines copy one same-host READ of
	// parallelCopyMin (2 MiB) or more: one core copies well under what the
	// memory bus carries. Up to GOMAXPROCS-1 helpers in the process
	// stay 500 µs after a copy, spinning, for the next one (waking an
	// idle core can take a millisecond).
	// Default GOMAXPROCS, at most 4; 1 copies every READ on one goroutine,
	// with no helpers.
	CopyWorkers int
	// PushBuffer is how many bytes of pushed blocks a consumer keeps per
	// producer until its READs claim them: a producer on another host then
	// sends an entry's blocks with its ack, and the READ needs no round
	// trip. Default 8 MiB; negative: ask for no pushes.
	PushBuffer int
	// NoPush: a producer never pushes, even to consumers that ask.
	NoPush bool
	Logger *slog.Logger
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
	if c.CopyWorkers <= 0 {
		c.CopyWorkers = min(runtime.GOMAXPROCS(0), 4)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// agentMeta is the TCP data plane's agent metadata, msgpack-encoded into
// XferAck.agent_metadata:
//
//	{"v": 1, "name": agent name, "addr": "host:port" of its READ service,
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
	// producer publishes its grants there (xfer.GrantBoard).
	Grants int `msgpack:"gt,omitempty"`
	// Push: the producer pushes a grant's blocks to a consumer that asked
	// (a stage frame), see push.go.
	Push bool `msgpack:"push,omitempty"`
}

const (
	metaVersion = 1
	maxMetaLen  = 4096
)

// Errors of TCPData.
var (
	ErrBusy       = errors.New("transport: too many READs queued to this peer")
	ErrBadMeta    = errors.New("transport: bad agent metadata")
	ErrBlockRange = errors.New("transport: block id out of range")
)

// TCPData is the pure-Go data plane: an xfer.DataTransport over TCP. As a
// producer it serves one-sided READs of its region's blocks, only for blocks
// its Authorizer grants; as a consumer it posts READs that land straight in
// its region's blocks. Any number of READs may be in flight to one peer over
// one reused connection.
type TCPData struct {
	cfg    TCPConfig
	region *cache.Region
	meta   []byte
	name   string
	log    *slog.Logger
	auth   atomic.Pointer[Authorizer]
	ln     net.Listener
	wg     sync.WaitGroup
	notify wake.Hooks // OnReady's
	copier *copier    // same-host READs' parallel copies

	mu      sync.Mutex
	closed  bool
	peers   map[string]*peer
	handles map[xfer.Handle]*readOp
	next    xfer.Handle
	notifs  []xfer.Notif
	ready   chan struct{} // Ready: a READ ended or a notification came
	served  map[net.Conn]struct{}
	pushTo  map[string][]*servedConn // producer: connections taking pushes, by agent

	// producer, same-host path: the token in the region's header, and the
	// header's revocation counter (see revoke)
	token   []byte
	revokes *atomic.Uint64
	// producer, same-host path: the grant table (see GrantBoard), and
	// whether a session holds it
	grantTab  []atomic.Uint64
	boardHeld atomic.Bool
	// OnNotify's function
	notifyHook atomic.Pointer[func() bool]

	copies     atomic.Uint64 // READs landed from a shared region
	fastCopies atomic.Uint64 // of those, copied under a published grant, no READ sent
	precopies  atomic.Uint64 // of those, copied before their answer (precopier)
	beforeCopy func()        // tests: runs before a copy starts

	pushes     atomic.Uint64 // producer: grants pushed
	pushLanded atomic.Uint64 // consumer: READs landed from a push, no READ sent
	pushDrops  atomic.Uint64 // consumer: pushes dropped for want of room, or unclaimed
}

var (
	_ xfer.DataTransport = (*TCPData)(nil)
	_ xfer.Notifying     = (*TCPData)(nil)
)

// NewTCPData returns a data plane over region, serving READs if cfg.Listen is
// set.
func NewTCPData(cfg TCPConfig, region *cache.Region) (*TCPData, error) {
	cfg = cfg.withDefaults()
	inc := uuid.NewString()
	d := &TCPData{
		cfg: cfg, region: region, log: cfg.Logger, name: cfg.Name,
		peers: map[string]*peer{}, handles: map[xfer.Handle]*readOp{}, served: map[net.Conn]struct{}{},
		pushTo: map[string][]*servedConn{},
		ready:  make(chan struct{}, 1),
	}
	d.copier = newCopier(&d.wg)
	if d.name == "" {
		d.name = "ecxfer-" + inc[:8]
	}
	if len(d.name) > maxNameLen {
		return nil, fmt.Errorf("transport: agent name longer than %d bytes", maxNameLen)
	}
	if cfg.Authorize != nil {
		d.SetAuthorizer(cfg.Authorize)
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
	if h := region.Header(); h != nil && cfg.Listen != "" && !cfg.NoSharedMemory {
		d.token = h[:tokenLen:tokenLen]
		if _, err := rand.Read(d.token); err != nil {
			d.Close()
			return nil, err
		}
		d.revokes = (*atomic.Uint64)(unsafe.Pointer(&h[revokesOff]))
		m.Shm, m.ShmOff = region.SharedPath(), cache.HeaderSize()
		if cfg.Authorize == nil && len(h) > grantTabOff {
			// With a gate of the user's every READ must go through it:
			// no board then.
			d.grantTab = unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&h[grantTabOff])), (len(h)-grantTabOff)/8)
			m.Grants = len(d.grantTab)
		}
	}
	var err error
	d.meta, err = encodeMeta(m)
	if err != nil {
		d.Close()
		return nil, err
	}
	if d.ln != nil {
		// Only now: a consumer that connects at once finds the token,
		// the board and the metadata in place.
		d.wg.Add(1)
		go d.accept()
	}
	return d, nil
}

func encodeMeta(m agentMeta) ([]byte, error) { return msgpack.Marshal(&m) }

// SetAuthorizer installs the gate for READs served (see Authorizer),
// replacing the one there was. READs that same-host consumers copy under
// grants a session published (ClaimGrantBoard) do not reach it: a gate
// that must see every READ goes in TCPConfig.Authorize, which turns the
// board off.
func (d *TCPData) SetAuthorizer(a Authorizer) { d.auth.Store(&a) }

// Authorizer returns the gate installed, or nil.
func (d *TCPData) Authorizer() Authorizer {
	if a := d.auth.Load(); a != nil {
		return *a
	}
	return nil
}

// ClaimGrantBoard implements xfer.GrantBoard: true once, for the producer
// session that publishes its grants in the Shared region's grant table, so
// that consumers on this host copy without a READ round trip. False when
// another session holds the table, or there is none (a region not Shared,
// NoSharedMemory, or a TCPConfig.Authorize of the caller's, which every
// READ must then pass).
func (d *TCPData) ClaimGrantBoard() bool {
	return d.grantTab != nil && d.boardHeld.CompareAndSwap(false, true)
}

// PublishGrant implements xfer.GrantBoard. A grant whose slot another live
// grant holds is not published: its consumer asks per READ.
func (d *TCPData) PublishGrant(id uint64) {
	if n := uint64(len(d.grantTab)); n > 0 && id != 0 {
		d.grantTab[id%n].CompareAndSwap(0, id)
	}
}

// RetireGrant implements xfer.GrantBoard.
func (d *TCPData) RetireGrant(id uint64) {
	if n := uint64(len(d.grantTab)); n > 0 && id != 0 {
		d.grantTab[id%n].CompareAndSwap(id, 0)
	}
}

// ReleaseGrantBoard implements xfer.GrantBoard: the table is cleared and
// another session may claim it.
func (d *TCPData) ReleaseGrantBoard() {
	for i := range d.grantTab {
		d.grantTab[i].Store(0)
	}
	d.boardHeld.Store(false)
}

// TCPStats counts a TCPData's READs landed without the usual round trip.
type TCPStats struct {
	SharedCopies uint64 // READs copied out of a same-host producer's shared region
	Unasked      uint64 // of those, under a grant the producer published: no READ sent
	Precopied    uint64 // of those, copied before the producer's answer to the READ
	Pushed       uint64 // READs landed from blocks the producer pushed: no READ sent
	PushDrops    uint64 // pushes dropped: no room, or no READ claimed them in time
	PushesSent   uint64 // as a producer: grants pushed
}

// Stats returns the counters; it is safe to call from any goroutine.
func (d *TCPData) Stats() TCPStats {
	return TCPStats{SharedCopies: d.copies.Load(), Unasked: d.fastCopies.Load(), Precopied: d.precopies.Load(),
		Pushed: d.pushLanded.Load(), PushDrops: d.pushDrops.Load(), PushesSent: d.pushes.Load()}
}

// Name returns the agent name.
func (d *TCPData) Name() string { return d.name }

// Addr returns the address READs are served on, or nil.
func (d *TCPData) Addr() net.Addr {
	if d.ln == nil {
		return nil
	}
	return d.ln.Addr()
}

// AgentMetadata implements xfer.DataTransport.
func (d *TCPData) AgentMetadata() []byte { return d.meta }

// MemDescriptor implements xfer.DataTransport: an empty descriptor list.
// Only a TCPData reads from a TCPData, and the metadata carries the block
// count; the reference's per-block list would add 14 bytes per block to
// every ack until the consumer's first READ (1.4 MB for 100,000 blocks).
func (d *TCPData) MemDescriptor() []byte { return emptyDescs }

// emptyDescs is msgpack's empty array, which vLLM's consumers would decode
// as no descriptors.
var emptyDescs = []byte{0x90}

// AddRemotePeer implements xfer.DataTransport. The descriptor is not used:
// the metadata says how many blocks the producer has.
func (d *TCPData) AddRemotePeer(metadata, _ []byte) (xfer.Peer, error) {
	if len(metadata) > maxMetaLen {
		// Ours is a few hundred bytes; a large blob could only nest deep.
		return xfer.Peer{}, fmt.Errorf("%w: %d bytes", ErrBadMeta, len(metadata))
	}
	var m agentMeta
	if err := msgpack.Unmarshal(metadata, &m); err != nil {
		return xfer.Peer{}, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	switch {
	case m.Version != metaVersion:
		return xfer.Peer{}, fmt.Errorf("%w: version %d", ErrBadMeta, m.Version)
	case m.Name == "" || len(m.Name) > maxNameLen || m.Addr == "" || len(m.Addr) > 512:
		return xfer.Peer{}, fmt.Errorf("%w: name %q addr %q", ErrBadMeta, m.Name, m.Addr)
	case m.BlockSize != d.region.BlockSize():
		return xfer.Peer{}, fmt.Errorf("%w: block size %d, ours %d", ErrBadMeta, m.BlockSize, d.region.BlockSize())
	case m.Blocks <= 0 || m.Blocks > 1<<31:
		return xfer.Peer{}, fmt.Errorf("%w: %d blocks", ErrBadMeta, m.Blocks)
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
		return xfer.Peer{}, fmt.Errorf("%w: %s registered with %d blocks, now %d", ErrBadMeta, m.Name, p.blocks, m.Blocks)
	}
	if p == nil {
		p = newPeer(d, m, key)
		if m.Shm != "" && !d.cfg.NoSharedMemory {
			if err := p.mapShared(m); err != nil {
				// Another host, another user, or no /proc: TCP it is.
				d.log.Debug("ec data: producer's region not mapped, reading over TCP", "peer", key, "err", err)
			} else {
				if p.populates {
					p.readers.Add(1)
					d.wg.Add(1)
					go p.populate()
				}
				p.pre = make(chan *readOp, d.cfg.MaxQueued)
				p.readers.Add(1)
				d.wg.Add(1)
				go p.precopier()
			}
		}
		if m.Push && p.shm == nil {
			p.stageCap = d.cfg.PushBuffer
		}
		d.peers[key] = p
	}
	p.refs++
	return xfer.Peer{Agent: key, Blocks: m.Blocks}, nil
}

// RemoveRemotePeer implements xfer.DataTransport. The last removal closes
// the peer's connection; READs still in flight to it fail.
func (d *TCPData) RemoveRemotePeer(agent string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.peers[agent]
	if p == nil {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	if p.refs--; p.refs == 0 {
		delete(d.peers, agent)
		p.shutdown(fmt.Errorf("transport: peer %s removed", agent))
	}
	return nil
}

// PostRead implements xfer.DataTransport. It fails with
// xfer.ErrLengthMismatch, ErrBlockRange (a local or remote id outside its
// region), xfer.ErrUnknownPeer, ErrBusy (MaxQueued READs to that peer not
// ended), xfer.ErrClosed, or for a notification over 1 KiB.
func (d *TCPData) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	if len(local) != len(remote) {
		return 0, xfer.ErrLengthMismatch
	}
	if len(notif) > maxNotifLen {
		return 0, fmt.Errorf("transport: notification longer than %d bytes", maxNotifLen)
	}
	for _, b := range local {
		if b < 0 || b >= d.region.Blocks() {
			return 0, fmt.Errorf("%w: local %d of %d", ErrBlockRange, b, d.region.Blocks())
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
			return 0, fmt.Errorf("%w: remote %d of %d", ErrBlockRange, b, p.blocks)
		}
	}
	if p.inflight.Add(1) > int64(d.cfg.MaxQueued) {
		p.inflight.Add(-1)
		d.mu.Unlock()
		return 0, fmt.Errorf("%w: %s", ErrBusy, agent)
	}
	d.next++
	op := &readOp{h: d.next, id: uint64(d.next), n: len(local), local: spans(nil, local), remote: spans(nil, remote),
		notif: bytes.Clone(notif), peer: p}
	d.handles[op.h] = op
	if p.stageCap > 0 && d.postPushed(p, op) {
		return op.h, nil
	}
	if g := p.publishedGrant(notif); g != 0 {
		// The same-host path under a published grant: copy, check the
		// grant outlived the copy, notify; no READ round trip. The
		// caller's goroutine copies a small READ that comes alone
		// (latency); the precopier takes large ones, and bursts (a
		// step that took many acks), off the caller's loop and on
		// another core.
		op.fast, op.grant = true, g
		now := time.Now().UnixNano()
		burst := now-p.lastFast < int64(fastBurst)
		p.lastFast = now
		if op.n*d.region.BlockSize() < precopyMin && !burst {
			p.readers.Add(1) // p is not shut down: it is in d.peers, under d.mu
			d.mu.Unlock()
			if p.copyFast(op) {
				p.notify([]*readOp{op})
			}
			p.readers.Done()
			return op.h, nil
		}
		select {
		case p.pre <- op:
			d.mu.Unlock()
			return op.h, nil
		default: // the precopier is behind: ask per READ
			op.fast, op.grant = false, 0
		}
	}
	defer d.mu.Unlock()
	if len(p.ops) == 0 && p.tryPost(op) {
		return op.h, nil
	}
	select {
	case p.ops <- op:
	default: // cannot happen while inflight bounds the queue
		p.inflight.Add(-1)
		delete(d.handles, op.h)
		return 0, fmt.Errorf("%w: %s", ErrBusy, agent)
	}
	return op.h, nil
}

// fastBurst: a READ posted within this of the previous one to its peer is
// part of a burst (a step that took many acks), which the precopier copies
// while the step goes on; a lone one is copied at once.
const fastBurst = 50 * time.Microsecond

// checkAfterCopy says a copy's loads are done before a later load of the
// grant table is: so on amd64, where loads are not reordered with older
// loads. Elsewhere a consumer asks per READ (the Go memory model offers
// no read fence to put between them).
const checkAfterCopy = runtime.GOARCH == "amd64"

// publishedGrant returns the grant a READ's notification names
// ("...#<grant>") if the producer's grant table shows it live, else 0.
func (p *peer) publishedGrant(notif []byte) uint64 {
	if !checkAfterCopy || len(p.grantTab) == 0 {
		return 0
	}
	_, g, _, ok := wire.SplitNotifGrant(notif)
	if !ok || g == 0 || p.grantTab[g%uint64(len(p.grantTab))].Load() != g {
		return 0
	}
	return g
}

// copyFast lands a READ under a published grant from the producer's
// region, then sends its notification. The grant was live when the ack
// came and grants only end: still published after the copy, it was live
// throughout, and the blocks held the entry. The caller holds a readers
// reference. true: op completed, and its notification is the caller's to
// send (notify).
func (p *peer) copyFast(op *readOp) bool {
	op.mu.Lock()
	if !op.state.CompareAndSwap(opPending, opWriting) {
		op.mu.Unlock()
		op.fail() // released before the copy
		return false
	}
	if f := p.d.beforeCopy; f != nil {
		f()
	}
	p.copyBlocks(op)
	live := p.grantTab[op.grant%uint64(len(p.grantTab))].Load() == op.grant
	op.mu.Unlock()
	if !live {
		op.fail() // the grant ended meanwhile: the bytes may be torn
		return false
	}
	p.d.copies.Add(1)
	p.d.fastCopies.Add(1)
	// Complete now, settled once the notification is out (it keeps its
	// place in the in-flight bound, and so in the writers' queue).
	op.state.Store(opComplete)
	p.d.signal()
	return true
}

// notify sends the notifications of fast READs that completed, in one
// write when a link is free, else through the writers; each is settled
// once out.
func (p *peer) notify(ops []*readOp) {
	if p.tryNotify(ops) {
		return
	}
	for _, op := range ops {
		select {
		case p.ops <- op:
		default: // cannot happen while inflight bounds the queue
			op.settle()
		}
	}
}

// tryNotify sends fast READs' notifications on a connected link no one is
// writing to, without waiting, and settles them; false: no link was free.
func (p *peer) tryNotify(ops []*readOp) bool {
	for _, l := range p.links {
		if !l.wmu.TryLock() {
			continue
		}
		l.mu.Lock()
		conn, raw := l.conn, l.raw
		l.mu.Unlock()
		if conn == nil || raw == nil {
			l.wmu.Unlock()
			continue
		}
		l.frame = l.frame[:0]
		for _, op := range ops {
			l.frame = appendNotify(l.frame, op.notif)
		}
		l.sendFrameLocked(conn, raw)
		for _, op := range ops {
			op.settle()
		}
		return true
	}
	return false
}

// Check implements xfer.DataTransport.
func (d *TCPData) Check(h xfer.Handle) (xfer.Progress, error) {
	d.mu.Lock()
	op := d.handles[h]
	d.mu.Unlock()
	if op == nil {
		return 0, fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	switch op.state.Load() {
	case opComplete:
		return xfer.Complete, nil
	case opFailed:
		return xfer.Failed, nil
	}
	return xfer.InProgress, nil
}

// Release implements xfer.DataTransport. A READ whose bytes have not started
// arriving is cancelled (its bytes, if they come, are discarded). One whose
// bytes are landing is stopped: its connection is closed, which fails the
// READs queued behind it, and Release waits for the reader to leave the
// blocks. Nothing writes into the READ's blocks once Release returns.
func (d *TCPData) Release(h xfer.Handle) error {
	d.mu.Lock()
	op := d.handles[h]
	delete(d.handles, h)
	d.mu.Unlock()
	if op == nil {
		return fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	if op.state.CompareAndSwap(opPending, opCanceled) || op.state.Load() != opWriting {
		return nil
	}
	if op.fast || op.byPush.Load() {
		op.mu.Lock() // the copier holds it while bytes land
		//lint:ignore SA2001 taking the lock was the point: the copier is out of the blocks
		op.mu.Unlock()
		return nil
	}
	l := op.link.Load()
	l.mu.Lock()
	if l.conn != nil {
		l.breakConnLocked(errReleased)
	}
	l.mu.Unlock()
	l.landing.Lock() // the reader holds it while bytes land
	//lint:ignore SA2001 taking the lock was the point: the reader is out of the blocks
	l.landing.Unlock()
	return nil
}

var errReleased = errors.New("transport: READ released while landing")

// Ready implements xfer.Signaling: it receives when a READ posted here
// ended or a notification arrived since the last receive, so that a step
// loop sleeps until there is something to do.
func (d *TCPData) Ready() <-chan struct{} { return d.ready }

func (d *TCPData) signal() {
	select {
	case d.ready <- struct{}{}:
	default:
	}
	d.notify.Call()
}

// OnReady implements xfer.Notifying: f is called, on the goroutine that
// ended the READ or took the notification, each time Ready's channel is
// sent to, until stop.
func (d *TCPData) OnReady(f func()) (stop func()) { return d.notify.Add(f) }

// StopsReads implements xfer.Stoppable: Release stops every READ.
func (d *TCPData) StopsReads() bool { return true }

// DrainNotifs implements xfer.DataTransport.
func (d *TCPData) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dst = append(dst, d.notifs...)
	clear(d.notifs)
	d.notifs = d.notifs[:0]
	return dst, nil
}

// Close implements xfer.DataTransport: it stops serving, closes every
// connection, fails the READs in flight and waits for its goroutines.
func (d *TCPData) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	for _, p := range d.peers {
		p.shutdown(xfer.ErrClosed)
	}
	clear(d.peers)
	for c := range d.served {
		c.Close()
	}
	clear(d.handles)
	d.mu.Unlock()
	if d.ln != nil {
		d.ln.Close()
	}
	d.copier.close()
	d.wg.Wait()
	return nil
}

// ---- consumer side ----

const (
	opPending  int32 = iota // posted, no byte landed yet
	opCanceled              // released before its bytes came: discard them
	opWriting               // bytes are landing in the local blocks
	opComplete
	opFailed
)

type readOp struct {
	link    atomic.Pointer[link] // the connection it was sent on
	sentAt  atomic.Int64         // when, in Unix nanoseconds
	h       xfer.Handle
	id      uint64
	n       int      // blocks
	local   [][2]int // the blocks as runs of consecutive ids (start, length):
	remote  [][2]int // a large READ's ids take a few words, not a copy each
	notif   []byte
	state   atomic.Int32
	peer    *peer
	settled atomic.Bool
	// precopied says the precopier copied the blocks already (under the
	// link's landing lock, which guards it).
	precopied bool
	// fast: copied under grant, published in the producer's grant table,
	// without a READ frame (copyFast, under mu); its notification goes
	// out after.
	fast  bool
	grant uint64
	mu    sync.Mutex
	// byPush: a push is landing (or landed) in it although its READ was
	// sent; Release waits on mu for it (push.go).
	byPush atomic.Bool
	// resend: we dropped its push; the producer sends the bytes again.
	resend bool
	asked  string // its notification, while it is in peer.asked
}

// fail ends an op that has not completed, unless a push is landing in it
// (its lander ends it: landAsked).
func (op *readOp) fail() {
	for {
		s := op.state.Load()
		if s == opComplete || s == opFailed || s == opWriting && op.byPush.Load() {
			return
		}
		if op.state.CompareAndSwap(s, opFailed) {
			op.settle()
			return
		}
	}
}

// complete ends an op whose bytes all landed.
func (op *readOp) complete() {
	op.state.Store(opComplete)
	op.settle()
}

// settle gives the op's place in its peer's in-flight bound back, once,
// and wakes a loop waiting on Ready.
func (op *readOp) settle() {
	if op.settled.CompareAndSwap(false, true) {
		op.peer.inflight.Add(-1)
		op.peer.d.signal()
	}
}

// peer is a producer this agent reads from: a few connections, each with a
// writer goroutine taking READs from the peer's queue and a reader goroutine
// taking the answers in order. Several connections let the producer's
// writes and our reads of different READs run on different cores.
type peer struct {
	d      *TCPData
	name   string
	addr   string
	blocks int
	refs   int
	ops    chan *readOp
	stop   chan struct{}
	once   sync.Once
	links  []*link
	// inflight counts READs posted and not ended: at most MaxQueued, so
	// a producer that stops answering cannot make them pile up.
	inflight atomic.Int64

	// The same-host path: the producer's region mapped read-only (its
	// blocks start at shmOff), the token read from its header, its
	// revocation counter. Unmapped once every reader has left.
	shm       []byte
	shmOff    int
	token     []byte
	revokes   *atomic.Uint64
	grantTab  []atomic.Uint64 // the producer's published grants, if it has a table
	readers   sync.WaitGroup
	shmKey    regionKey
	lastFast  int64        // when the last fast READ was posted, under d.mu
	unmap     func()       // gives the mapping back
	populates bool         // the first to map the region in this process populates it
	pre       chan *readOp // large READs for the precopier

	// Pushes kept until READs claim them (push.go), under smu.
	stageCap    int // bytes; 0: the producer does not push to us
	smu         sync.Mutex
	staged      map[string]*staged // by notification
	stageOrder  []*staged          // oldest first
	stagedBytes int
	freeBufs    [][]byte
	asked       map[string]*readOp  // READs sent under a grant, by notification
	lost        map[string]struct{} // notifications whose push we dropped
}

// regionKey names a producer's region file (its inode); borrowed: the
// mapping is the producer's own, in this process (cache.BorrowShared).
type regionKey struct {
	dev, ino uint64
	borrowed bool
}

// borrowOwn lets a consumer read a producer region of its own process
// through the producer's mapping, whose pages are in the page tables
// already (on the development VM a first touch of each page costs 3 µs).
// Tests turn it off to exercise the mapping of another process's region.
var borrowOwn = true

// regionMaps are the producers' regions mapped in this process, shared by
// every TCPData in it (an engine with several pools, or a fleet of
// consumers run as goroutines): one mapping a region, not one per
// consumer, so that its page tables are filled once.
var regionMaps = struct {
	sync.Mutex
	m map[regionKey]*regionMap
}{m: map[regionKey]*regionMap{}}

type regionMap struct {
	mem  []byte
	refs int
}

// mapRegion maps f (size bytes) read-only, or takes another reference to
// this process's mapping of it; first says the mapping is new.
func mapRegion(f *os.File, size int) (mem []byte, key regionKey, first bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, key, false, err
	}
	key = regionKey{dev: uint64(st.Dev), ino: st.Ino}
	if borrowOwn {
		if mem, ok := cache.BorrowShared(cache.SharedKey{Dev: key.dev, Ino: key.ino}); ok {
			if len(mem) == size {
				key.borrowed = true
				return mem, key, false, nil
			}
			cache.ReturnShared(cache.SharedKey{Dev: key.dev, Ino: key.ino}, mem)
		}
	}
	regionMaps.Lock()
	defer regionMaps.Unlock()
	if r := regionMaps.m[key]; r != nil && len(r.mem) == size {
		r.refs++
		return r.mem, key, false, nil
	}
	mem, err = unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, key, false, err
	}
	if regionMaps.m[key] == nil { // else a stale size: keep that one's entry, map this privately
		regionMaps.m[key] = &regionMap{mem: mem, refs: 1}
	}
	return mem, key, true, nil
}

// unmapRegion drops a reference taken by mapRegion.
func unmapRegion(mem []byte, key regionKey) {
	regionMaps.Lock()
	defer regionMaps.Unlock()
	if r := regionMaps.m[key]; r != nil && unsafe.SliceData(r.mem) == unsafe.SliceData(mem) {
		if r.refs--; r.refs > 0 {
			return
		}
		delete(regionMaps.m, key)
	}
	unix.Munmap(mem)
}

// mapShared maps the producer's Shared region read-only and reads its
// token, which the hello then proves to the producer: a path that names
// some other file, or another host's, gives a token the producer refuses.
func (p *peer) mapShared(m agentMeta) error {
	var pid, fd int
	if n, err := fmt.Sscanf(m.Shm, "/proc/%d/fd/%d", &pid, &fd); n != 2 || err != nil ||
		m.Shm != fmt.Sprintf("/proc/%d/fd/%d", pid, fd) || m.ShmOff < revokesOff+8 || m.ShmOff%8 != 0 ||
		m.Grants < 0 || (m.Grants > 0 && (m.ShmOff < grantTabOff || m.Grants > (m.ShmOff-grantTabOff)/8)) {
		return fmt.Errorf("%w: shared region %q at %d", ErrBadMeta, m.Shm, m.ShmOff)
	}
	// Only a producer's region file: metadata from another host could
	// name one of this process's own files, whose first bytes the hello
	// would then send out as the token.
	if target, err := os.Readlink(m.Shm); err != nil || !strings.HasPrefix(target, "/memfd:"+cache.SharedFileName) {
		return fmt.Errorf("%w: %s is not a shared region (%s)", ErrBadMeta, m.Shm, target)
	}
	f, err := os.Open(m.Shm)
	if err != nil {
		return err
	}
	defer f.Close()
	// A file that could shrink could make a copy out of our mapping fault
	// (SIGBUS), so only a sealed one is mapped.
	if seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&cache.SharedSeals != cache.SharedSeals {
		return fmt.Errorf("%w: %s is not sealed against resizing (%v)", ErrBadMeta, m.Shm, err)
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	need := int64(m.ShmOff) + int64(m.Blocks)*int64(m.BlockSize)
	if st.Size() < need || st.Size() > need+int64(os.Getpagesize()) {
		return fmt.Errorf("%w: shared region of %d bytes, want %d", ErrBadMeta, st.Size(), need)
	}
	mem, key, first, err := mapRegion(f, int(st.Size()))
	if err != nil {
		return err
	}
	p.shm, p.shmOff, p.shmKey, p.populates = mem, m.ShmOff, key, first
	p.unmap = func() { unmapRegion(mem, key) }
	if key.borrowed {
		p.unmap = func() { cache.ReturnShared(cache.SharedKey{Dev: key.dev, Ino: key.ino}, mem) }
	}
	p.token = bytes.Clone(mem[:tokenLen])
	p.revokes = (*atomic.Uint64)(unsafe.Pointer(&mem[revokesOff]))
	if m.Grants > 0 {
		p.grantTab = unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&mem[grantTabOff])), m.Grants)
	}
	return nil
}

// populate maps the pages of the producer's region into our page tables
// ahead of the copies, off the step loop: a first touch costs a page fault
// per 4 KiB page (about 3 µs each on the development VM, more than the
// copy). It stops at the peer's shutdown; kernels before 5.14 lack
// MADV_POPULATE_READ, and then the copies fault the pages in.
func (p *peer) populate() {
	defer p.d.wg.Done()
	defer p.readers.Done()
	const chunk = 16 << 20
	for off := 0; off < len(p.shm); off += chunk {
		select {
		case <-p.stop:
			return
		default:
		}
		if unix.Madvise(p.shm[off:min(off+chunk, len(p.shm))], unix.MADV_POPULATE_READ) != nil {
			return
		}
	}
}

// revokesOff is where a Shared region's header keeps its revocation
// counter, after the token; grantTabOff where its grant table starts (a
// slot per grant id modulo the slots: the id while the grant is live, else
// zero), up to the end of the header.
const (
	revokesOff  = 64
	grantTabOff = 4096
)

// link is one connection to a peer.
type link struct {
	p       *peer
	mu      sync.Mutex // guards conn and pending; never held across I/O
	wmu     sync.Mutex // serialises writes to conn
	landing sync.Mutex // held by the reader while bytes land in the region
	dial    sync.Mutex // held while connecting
	conn    net.Conn
	raw     *nbWriter // conn's, for writes that must not wait
	pending []*readOp // sent, answer not read yet, in order
	frame   []byte    // tryPost's, under wmu
}

func newPeer(d *TCPData, m agentMeta, key string) *peer {
	p := &peer{d: d, name: key, addr: m.Addr, blocks: m.Blocks,
		ops: make(chan *readOp, d.cfg.MaxQueued), stop: make(chan struct{})}
	for range d.cfg.Conns {
		l := &link{p: p}
		p.links = append(p.links, l)
		d.wg.Add(1)
		go l.writer()
	}
	return p
}

// shutdown stops the peer's goroutines and fails its READs. Called with d.mu.
func (p *peer) shutdown(err error) {
	p.once.Do(func() {
		close(p.stop)
		for _, l := range p.links {
			l.mu.Lock()
			l.breakConnLocked(err)
			l.mu.Unlock()
		}
		if p.shm != nil {
			// No reader starts after the loop above (connect checks stop
			// under l.mu); the mapping goes once the last one left.
			p.d.wg.Add(1)
			go func() {
				defer p.d.wg.Done()
				p.readers.Wait()
				p.unmap()
			}()
		}
	})
}

// breakConnLocked closes the connection and fails every READ sent on it.
func (l *link) breakConnLocked(err error) {
	if l.conn != nil {
		l.conn.Close()
		l.conn, l.raw = nil, nil
		l.p.d.log.Debug("ec data: connection to producer closed", "peer", l.p.name, "err", err)
	}
	for _, op := range l.pending {
		op.fail()
	}
	clear(l.pending)
	l.pending = l.pending[:0]
}

func (l *link) writer() {
	defer l.p.d.wg.Done()
	var buf []byte
	for {
		var op *readOp
		select {
		case <-l.p.stop:
			for {
				select {
				case op := <-l.p.ops:
					op.fail()
					op.settle() // a fast READ's, complete
				default:
					return
				}
			}
		case op = <-l.p.ops:
		}
		if op.fast {
			l.notify(op)
			continue
		}
		if op.state.Load() == opCanceled {
			op.fail()
			continue
		}
		buf = l.sendOn().send(op, buf)
	}
}

// sendOn is the link a writer sends its READ on: its own, but the first
// while that one is down and the producer pushes to us. Pushes come on
// the first link only, and tryPost keeps using a link that is up: one
// READ at a time, a READ another writer took could leave the first link
// down for good, and nothing would be pushed.
func (l *link) sendOn() *link {
	first := l.p.links[0]
	if l == first || l.p.stageCap == 0 || first.up() {
		return l
	}
	return first
}

// up reports whether l has a connection.
func (l *link) up() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn != nil
}

// send writes op's READ on l, connecting it first if it must; buf is
// scratch space, returned for the next READ.
func (l *link) send(op *readOp, buf []byte) []byte {
	conn, err := l.connect()
	if err != nil {
		l.p.d.log.Warn("ec data: cannot reach producer", "peer", l.p.name, "addr", l.p.addr, "err", err)
		op.fail()
		return buf
	}
	buf = appendRead(buf[:0], op.id, op.notif, op.n, op.remote, op.resend)
	// Under wmu from here: the order of pending is the order of the
	// writes, whichever goroutine writes (PostRead may, see tryPost).
	l.wmu.Lock()
	l.mu.Lock()
	if l.conn != conn { // broken meanwhile
		l.mu.Unlock()
		l.wmu.Unlock()
		op.fail()
		return buf
	}
	op.link.Store(l)
	op.sentAt.Store(time.Now().UnixNano())
	l.pending = append(l.pending, op)
	l.mu.Unlock()
	err = l.writeLocked(conn, buf)
	l.wmu.Unlock()
	if err != nil {
		l.breakIfCurrent(conn, err)
		return buf
	}
	l.p.precopy(op)
	return buf
}

// notify sends a fast READ's notification, and settles it. One that
// cannot be sent is lost, as a data plane's notification may be: the
// producer's lease ends the grant.
func (l *link) notify(op *readOp) {
	defer op.settle()
	conn, err := l.connect()
	if err != nil {
		l.p.d.log.Warn("ec data: cannot reach producer", "peer", l.p.name, "addr", l.p.addr, "err", err)
		return
	}
	if err := l.write(conn, appendNotify(nil, op.notif)); err != nil {
		l.breakIfCurrent(conn, err)
	}
}

// tryPost sends op's READ on a connected link that no one is writing to,
// on the caller's goroutine, when the socket takes the frame without
// waiting: the READ then leaves without a hand-off to a writer goroutine.
// A frame the socket takes only in part is finished by a goroutine of its
// own. false: no link was free, and op goes to the writers' queue.
func (p *peer) tryPost(op *readOp) bool {
	if p.stageCap > 0 && !p.links[0].up() {
		// The link pushes come on is down (never up, or broken): a
		// writer brings it up with this READ (sendOn). Else the other
		// links could take every READ, and nothing would be pushed again.
		return false
	}
	for _, l := range p.links {
		if !l.wmu.TryLock() {
			continue
		}
		l.mu.Lock()
		conn, raw := l.conn, l.raw
		if conn == nil || raw == nil {
			l.mu.Unlock()
			l.wmu.Unlock()
			continue
		}
		l.frame = appendRead(l.frame[:0], op.id, op.notif, op.n, op.remote, op.resend)
		op.link.Store(l)
		op.sentAt.Store(time.Now().UnixNano())
		l.pending = append(l.pending, op)
		l.mu.Unlock()
		if l.sendFrameLocked(conn, raw) == nil { // else the break failed op
			p.precopy(op) // after the write: the producer's part starts first
		}
		return true
	}
	return false
}

// sendFrameLocked writes l.frame on conn without waiting; the caller holds
// wmu, which is released at once, or, when the socket took the frame only
// in part, by a goroutine of its own once it wrote the rest. A write that
// fails breaks the connection; its error is returned.
func (l *link) sendFrameLocked(conn net.Conn, raw *nbWriter) error {
	n, err := raw.write(l.frame)
	switch {
	case err != nil:
		l.wmu.Unlock()
		l.breakIfCurrent(conn, err)
	case n < len(l.frame):
		rest := bytes.Clone(l.frame[n:])
		l.p.d.wg.Add(1)
		go func() {
			defer l.p.d.wg.Done()
			err := l.writeLocked(conn, rest)
			l.wmu.Unlock()
			if err != nil {
				l.breakIfCurrent(conn, err)
			}
		}()
	default:
		l.wmu.Unlock()
	}
	return err
}

// write sends one frame on conn within the I/O timeout.
func (l *link) write(conn net.Conn, frame []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.writeLocked(conn, frame)
}

// writeLocked writes b within the I/O timeout; the caller holds wmu. The
// deadline goes after: one left behind would fail tryPost's raw writes.
func (l *link) writeLocked(conn net.Conn, b []byte) error {
	conn.SetWriteDeadline(time.Now().Add(l.p.d.cfg.IOTimeout))
	_, err := conn.Write(b)
	conn.SetWriteDeadline(time.Time{})
	return err
}

// breakIfCurrent breaks conn if it is still the link's connection.
func (l *link) breakIfCurrent(conn net.Conn, err error) {
	l.mu.Lock()
	if l.conn == conn {
		l.breakConnLocked(err)
	}
	l.mu.Unlock()
}

// connect returns the live connection, dialing one if there is none.
// Two writers may call it at once (sendOn): the second waits for the
// first's dial and takes its connection.
func (l *link) connect() (net.Conn, error) {
	l.dial.Lock()
	defer l.dial.Unlock()
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := net.DialTimeout("tcp", l.p.addr, l.p.d.cfg.DialTimeout)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tuneConn(tc)
	}
	c = quietIO(c)
	c.SetWriteDeadline(time.Now().Add(l.p.d.cfg.IOTimeout))
	hello := appendHello(nil, l.p.d.name)
	if l.p.shm != nil {
		hello = appendHello2(nil, l.p.d.name, l.p.token)
	}
	if l.p.stageCap > 0 {
		// Pushes come on the first link only, where tryPost sends READs
		// first: a READ that goes out before its push came is then
		// answered "pushed", not with the bytes again. The others say
		// 0: no pushes, but notifications of pushes landed.
		room := 0
		if l == l.p.links[0] {
			room = l.p.stageCap
		}
		hello = appendStage(hello, uint32(room))
	}
	if _, err := c.Write(hello); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	l.mu.Lock()
	select {
	case <-l.p.stop:
		l.mu.Unlock()
		c.Close()
		return nil, xfer.ErrClosed
	default:
	}
	l.conn = c
	l.raw = newNBWriter(c)
	l.p.readers.Add(1)
	l.mu.Unlock()
	l.p.d.wg.Add(1)
	go l.reader(c)
	return c, nil
}

// reader takes the producer's answers in order, landing each READ's bytes
// straight in the local blocks.
func (l *link) reader(c net.Conn) {
	defer l.p.d.wg.Done()
	defer l.p.readers.Done()
	var hdr [headLen + 17]byte
	var done []byte
	bs := l.p.d.region.BlockSize()
	fail := func(err error) {
		l.mu.Lock()
		if l.conn == c {
			l.breakConnLocked(err)
		} else {
			c.Close()
		}
		l.mu.Unlock()
	}
	timeout := l.p.d.cfg.IOTimeout
	for {
		// Wait for an answer. An idle connection may wait forever; the
		// oldest READ outstanding gets IOTimeout from when it was sent,
		// however long the connection was idle before.
		deadline := time.Now().Add(timeout)
		l.mu.Lock()
		if len(l.pending) > 0 {
			deadline = time.Unix(0, l.pending[0].sentAt.Load()).Add(timeout)
		}
		l.mu.Unlock()
		c.SetReadDeadline(deadline)
		n, err := io.ReadFull(c, hdr[:])
		if err != nil {
			var ne net.Error
			if n == 0 && errors.As(err, &ne) && ne.Timeout() {
				l.mu.Lock()
				waited, idle := time.Duration(0), len(l.pending) == 0
				if !idle {
					waited = time.Since(time.Unix(0, l.pending[0].sentAt.Load()))
				}
				mine := l.conn == c
				l.mu.Unlock()
				if mine && (idle || waited < timeout) {
					continue
				}
			}
			fail(err)
			return
		}
		if string(hdr[:4]) == frameMagic && hdr[4] == framePush {
			if err := l.takePush(c, int(binary.BigEndian.Uint16(hdr[5:])), binary.BigEndian.Uint64(hdr[14:])); err != nil {
				fail(err)
				return
			}
			continue
		}
		if string(hdr[:4]) != frameMagic || hdr[4] != frameData {
			fail(errProtocol)
			return
		}
		id := binary.BigEndian.Uint64(hdr[5:])
		status := hdr[13]
		size := binary.BigEndian.Uint64(hdr[14:])
		l.mu.Lock()
		var op *readOp
		if len(l.pending) > 0 && l.pending[0].id == id {
			op = l.pending[0]
			l.pending[0] = nil
			l.pending = l.pending[1:]
		}
		l.mu.Unlock()
		if op == nil {
			fail(fmt.Errorf("%w: answer %d out of order", errProtocol, id))
			return
		}
		l.p.answered(op)
		if status == dataPushed {
			// Its push, earlier on this connection, landed it (or it was
			// released): done, for its notification.
			if size != 0 {
				op.fail()
				fail(fmt.Errorf("%w: answer %d: pushed, with bytes", errProtocol, id))
				return
			}
			// No-op if the push completed it. Failed if its push was
			// dropped and forgotten (lost is bounded): retried.
			op.fail()
			done = appendDone(done[:0], id)
			if err := l.write(c, done); err != nil {
				fail(err)
				return
			}
			continue
		}
		if status == dataCopy && l.p.shm != nil {
			l.copyShared(op, size)
			done = appendDone(done[:0], id)
			if err := l.write(c, done); err != nil {
				fail(err)
				return
			}
			continue
		}
		if status != dataOK {
			op.fail()
			if size != 0 {
				fail(errProtocol)
				return
			}
			continue
		}
		if size != uint64(op.n)*uint64(bs) {
			op.fail()
			fail(fmt.Errorf("%w: %d bytes for %d blocks", errProtocol, size, op.n))
			return
		}
		l.landing.Lock()
		if op.state.CompareAndSwap(opPending, opWriting) {
			for _, r := range op.local {
				if err := readFullDeadline(c, l.p.d.region.Span(r[0], r[1]), l.p.d.cfg.IOTimeout); err != nil {
					op.fail()
					l.landing.Unlock()
					fail(err)
					return
				}
			}
			op.complete()
			l.landing.Unlock()
		} else {
			l.landing.Unlock()
			// Released before its bytes came (or a push landed it): drop
			// them.
			op.fail()
			if err := discard(c, int64(size), l.p.d.cfg.IOTimeout); err != nil {
				fail(err)
				return
			}
		}
		done = appendDone(done[:0], id)
		if err := l.write(c, done); err != nil {
			fail(err)
			return
		}
	}
}

// copyShared lands op's blocks from the producer's mapped region. The
// producer holds the grant until our done arrives, unless it revoked the
// hold (its timeout, or the connection closing), which it counts in the
// region's header before giving the blocks up: a count that moved since
// the grant (revokes, sent with the answer) means the bytes may be torn,
// and the READ fails.
func (l *link) copyShared(op *readOp, revokes uint64) {
	l.landing.Lock()
	defer l.landing.Unlock()
	if !op.state.CompareAndSwap(opPending, opWriting) {
		op.fail() // released before its bytes came
		return
	}
	if f := l.p.d.beforeCopy; f != nil {
		f()
	}
	if !op.precopied {
		l.p.copyBlocks(op)
	}
	if l.p.revokes.Load() != revokes {
		op.fail()
		return
	}
	l.p.d.copies.Add(1)
	op.complete()
}

// copyBlocks copies op's blocks out of the producer's mapped region; a
// large READ on CopyWorkers goroutines at once.
func (p *peer) copyBlocks(op *readOp) {
	bs := p.d.region.BlockSize()
	if w := p.d.cfg.CopyWorkers; w > 1 && op.n*bs >= parallelCopyMin {
		p.d.copier.copy(p.spans(op, nil), op.n*bs, min(w, op.n*bs/(parallelCopyMin/2)))
		return
	}
	p.walk(op, func(dst, src []byte) { copy(dst, src) })
}

// walk calls f for op's runs that are contiguous on both sides, in order:
// dst in the local region, src in the producer's mapped one.
func (p *peer) walk(op *readOp, f func(dst, src []byte)) {
	bs := p.d.region.BlockSize()
	src := p.shm[p.shmOff:]
	loc, rem := op.local, op.remote
	var lo, ro int // blocks of loc[0] and rem[0] already walked
	for len(loc) > 0 && len(rem) > 0 {
		n := min(loc[0][1]-lo, rem[0][1]-ro)
		r := (rem[0][0] + ro) * bs
		f(p.d.region.Span(loc[0][0]+lo, n), src[r:r+n*bs])
		if lo += n; lo == loc[0][1] {
			loc, lo = loc[1:], 0
		}
		if ro += n; ro == rem[0][1] {
			rem, ro = rem[1:], 0
		}
	}
}

// spans appends op's contiguous copies to s.
func (p *peer) spans(op *readOp, s []copySpan) []copySpan {
	off := 0
	p.walk(op, func(dst, src []byte) {
		s = append(s, copySpan{dst, src, off})
		off += len(dst)
	})
	return s
}

// precopyMin is the smallest READ the precopier takes: below it the hand-off
// to its goroutine costs more than the copy it overlaps.
const precopyMin = 256 << 10

// precopy hands a large READ just sent to the precopier, if there is room.
func (p *peer) precopy(op *readOp) {
	if p.pre == nil || op.n*p.d.region.BlockSize() < precopyMin {
		return
	}
	select {
	case p.pre <- op:
	default: // the reader copies it when the answer comes
	}
}

// precopier copies large READs out of the producer's region as soon as
// they are sent, so that the copy overlaps the producer's authorization
// instead of following it. Copying before the producer holds the grant is
// safe: the grant is live from its ack until the READ is authorized
// (grants only end, and each READ names its grant), so if the answer is
// "copy", the blocks held the entry all along; any other answer fails the
// READ and the bytes copied are dropped with it.
//
// It also copies READs under published grants (copyFast) that are large
// or come in a burst, and sends their notifications once the burst is
// copied, in one write.
func (p *peer) precopier() {
	defer p.d.wg.Done()
	defer p.readers.Done()
	done := make([]*readOp, 0, 64) // fast READs copied, notifications not sent
	for {
		select {
		case <-p.stop:
			for _, op := range done {
				op.settle()
			}
			for {
				select {
				case op := <-p.pre:
					op.fail() // a fast READ not copied (others fail with their link)
				default:
					return
				}
			}
		case op := <-p.pre:
			if op.fast {
				if p.copyFast(op) {
					done = append(done, op)
				}
				break
			}
			l := op.link.Load()
			l.landing.Lock()
			if op.state.CompareAndSwap(opPending, opWriting) {
				p.copyBlocks(op)
				op.precopied = true
				// Failed meanwhile (Release broke the connection): it stays so.
				op.state.CompareAndSwap(opWriting, opPending)
				l.p.d.precopies.Add(1)
			}
			l.landing.Unlock()
		}
		if len(done) > 0 && (len(p.pre) == 0 || len(done) == cap(done)) {
			// The burst is copied: its notifications in one write.
			p.notify(done)
			clear(done)
			done = done[:0]
		}
	}
}

// readFullDeadline fills b, allowing timeout without progress.
func readFullDeadline(c net.Conn, b []byte, timeout time.Duration) error {
	for len(b) > 0 {
		c.SetReadDeadline(time.Now().Add(timeout))
		n, err := c.Read(b)
		b = b[n:]
		if err != nil && len(b) > 0 {
			return err
		}
	}
	return nil
}

func discard(c net.Conn, n int64, timeout time.Duration) error {
	var buf [32 << 10]byte
	for n > 0 {
		m := min(n, int64(len(buf)))
		if err := readFullDeadline(c, buf[:m], timeout); err != nil {
			return err
		}
		n -= m
	}
	return nil
}

// ---- producer side ----

// maxQueuedNotifs bounds the notifications waiting for DrainNotifs.
const maxQueuedNotifs = 1 << 16

// OnNotify installs f, which a serving goroutine runs after it queued
// completion notifications (once for those that came in one read), so
// that a producer can take them where they arrive, without waking its
// loop; f reports whether it took them. If it did not, or no f is
// installed, Ready is signalled. nil removes f.
func (d *TCPData) OnNotify(f func() bool) {
	if f == nil {
		d.notifyHook.Store(nil)
		return
	}
	d.notifyHook.Store(&f)
}

// notified runs the OnNotify function, or signals Ready.
func (d *TCPData) notified() {
	if f := d.notifyHook.Load(); f != nil && (*f)() {
		return
	}
	d.signal()
}

func (d *TCPData) accept() {
	defer d.wg.Done()
	backoff := time.Millisecond
	for {
		c, err := d.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(backoff) // EMFILE and friends: do not spin
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			c.Close()
			return
		}
		d.served[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.serve(c)
	}
}

// serve answers one consumer's READs in order. Anything malformed closes
// this connection only.
func (d *TCPData) serve(accepted net.Conn) {
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		delete(d.served, accepted)
		d.mu.Unlock()
		accepted.Close()
	}()
	if tc, ok := accepted.(*net.TCPConn); ok {
		tuneConn(tc)
	}
	c := quietIO(accepted)
	var buf [headLen + 14]byte
	c.SetReadDeadline(time.Now().Add(d.cfg.IOTimeout))
	r := bufio.NewReaderSize(c, 4096) // frames from a consumer are small
	typ, err := readHead(r, buf[:])
	if err != nil || (typ != frameHello && typ != frameHello2) {
		return
	}
	nameLen, ok := readLen(r, buf[:], maxNameLen)
	if !ok {
		return
	}
	nameBuf := make([]byte, nameLen)
	if _, err := io.ReadFull(r, nameBuf); err != nil {
		return
	}
	agent := string(nameBuf)
	s := &servedConn{c: c, agent: agent, raw: newNBWriter(c)}
	defer d.unservePush(s)
	// A consumer that read our token from the shared region copies the
	// blocks itself; one that sent a wrong token is refused.
	shared := false
	if typ == frameHello2 {
		tok := make([]byte, tokenLen)
		if _, err := io.ReadFull(r, tok); err != nil || d.token == nil || !bytes.Equal(tok, d.token) {
			return
		}
		shared = true
	}
	// Grants held for consumers copying from the shared region, until
	// their done (or the hold's deadline, or the connection's end).
	type hold struct {
		release  func()
		deadline time.Time
	}
	holds := map[uint64]hold{}
	awaiting := map[uint64][]byte{} // served READs whose done has not come
	revoke := func(id uint64) {
		// Counted before the blocks are given up: a copy that overlaps
		// sees the count move and fails.
		d.revokes.Add(1)
		holds[id].release()
		delete(holds, id)
		delete(awaiting, id)
	}
	defer func() {
		for id := range holds {
			revoke(id)
		}
	}()
	var ids []int
	var runs [][2]int
	var out net.Buffers
	var head []byte
	notif := make([]byte, maxNotifLen)
	idBuf := make([]byte, 16<<10)
	maxBlocks := d.region.Blocks()
	// pending: notifications queued since the last d.notified, which runs
	// once the frames read so far are handled (a burst is one call).
	pending := false
	defer func() {
		if pending {
			d.notified()
		}
	}()
	for {
		if pending && r.Buffered() == 0 {
			pending = false
			d.notified()
		}
		idle := time.Now().Add(d.cfg.IdleTimeout)
		deadline := idle
		for _, h := range holds {
			if h.deadline.Before(deadline) {
				deadline = h.deadline
			}
		}
		c.SetReadDeadline(deadline)
		if _, err := io.ReadFull(r, buf[:1]); err != nil {
			var ne net.Error
			if len(holds) > 0 && errors.As(err, &ne) && ne.Timeout() {
				now := time.Now()
				for id, h := range holds {
					if !now.Before(h.deadline) {
						revoke(id)
					}
				}
				if deadline.Before(idle) {
					continue // a hold's deadline, not the idle timeout
				}
			}
			return
		}
		c.SetReadDeadline(time.Now().Add(d.cfg.IOTimeout))
		if _, err := io.ReadFull(r, buf[1:headLen]); err != nil || string(buf[:4]) != frameMagic {
			return
		}
		switch buf[4] {
		case frameDone:
			if _, err := io.ReadFull(r, buf[:8]); err != nil {
				return
			}
			id := binary.BigEndian.Uint64(buf[:8])
			if h, ok := holds[id]; ok {
				h.release()
				delete(holds, id)
			}
			if msg, ok := awaiting[id]; ok {
				delete(awaiting, id)
				d.mu.Lock()
				d.notifs = append(d.notifs, xfer.Notif{Agent: agent, Msg: msg})
				d.mu.Unlock()
				pending = true
			}
		case frameStage:
			if _, err := io.ReadFull(r, buf[:4]); err != nil {
				return
			}
			d.offerPush(s, binary.BigEndian.Uint32(buf[:4]), shared)
		case frameNotify:
			// A consumer that proved it maps our region copied under a
			// grant our table showed live, or one we push to landed a
			// push; the session matches the notification to the grant
			// and its agent, as any other.
			if !shared && !s.staged {
				return
			}
			nl, ok := readLen(r, buf[:], maxNotifLen)
			if !ok {
				return
			}
			if _, err := io.ReadFull(r, notif[:nl]); err != nil {
				return
			}
			d.mu.Lock()
			if len(d.notifs) >= maxQueuedNotifs {
				// Nobody drains them: a consumer flooding us, or a
				// producer that stopped stepping. Cut this one off.
				d.mu.Unlock()
				return
			}
			d.notifs = append(d.notifs, xfer.Notif{Agent: agent, Msg: bytes.Clone(notif[:nl])})
			d.mu.Unlock()
			pending = true
		case frameRead:
			if _, err := io.ReadFull(r, buf[:14]); err != nil {
				return
			}
			id := binary.BigEndian.Uint64(buf[:8])
			nl := int(binary.BigEndian.Uint16(buf[8:]))
			resend := nl&readResend != 0
			nl &^= readResend
			nb := int(binary.BigEndian.Uint32(buf[10:]))
			if nl > maxNotifLen || nb > maxBlocks || len(awaiting) >= d.cfg.MaxQueued {
				return
			}
			if _, dup := awaiting[id]; dup {
				// An id in flight again would overwrite its hold (a pin
				// never released) and its notification: cut it off (the
				// deferred revokes release every hold).
				return
			}
			if _, err := io.ReadFull(r, notif[:nl]); err != nil {
				return
			}
			// The ids a chunk at a time: 8,192 of them read 4 bytes a call
			// kept a core for about 100 us, as the consumer starts its
			// copy (20 us this way).
			ids = ids[:0]
			for left := nb; left > 0; {
				k := min(left, len(idBuf)/4)
				if _, err := io.ReadFull(r, idBuf[:4*k]); err != nil {
					return
				}
				for j := range k {
					b := int(binary.BigEndian.Uint32(idBuf[4*j:]))
					if b >= maxBlocks {
						return
					}
					ids = append(ids, b)
				}
				left -= k
			}
			if s.pushMax > 0 && !resend && s.wasPushed(notif[:nl], ids) {
				// Pushed ahead on this connection: the consumer has the
				// bytes; its done brings the notification.
				awaiting[id] = bytes.Clone(notif[:nl])
				head = appendDataHead(head[:0], id, dataPushed, 0)
				if s.writeHead(head, d.cfg.IOTimeout) != nil {
					return
				}
				continue
			}
			status := byte(dataRefused)
			var release func()
			if a := d.auth.Load(); a != nil {
				var ok bool
				if release, ok = (*a)(agent, notif[:nl], ids); ok {
					status = dataOK
				}
			}
			if status == dataOK && shared {
				// The consumer copies; we hold the grant until its done.
				if release == nil {
					release = func() {}
				}
				awaiting[id] = bytes.Clone(notif[:nl])
				holds[id] = hold{release, time.Now().Add(d.cfg.IOTimeout)}
				head = appendDataHead(head[:0], id, dataCopy, d.revokes.Load())
				if s.writeHead(head, d.cfg.IOTimeout) != nil {
					return
				}
				continue
			}
			size := uint64(0)
			if status == dataOK {
				size = uint64(nb) * uint64(d.region.BlockSize())
			}
			head = appendDataHead(head[:0], id, status, size)
			out = append(out[:0], head)
			if status == dataOK {
				runs = spans(runs[:0], ids)
				for _, r := range runs {
					out = append(out, d.region.Span(r[0], r[1]))
				}
				awaiting[id] = bytes.Clone(notif[:nl])
			}
			s.wmu.Lock() // see writeHead
			c.SetWriteDeadline(time.Now().Add(d.cfg.IOTimeout))
			_, err := out.WriteTo(c)
			c.SetWriteDeadline(time.Time{})
			s.wmu.Unlock()
			if release != nil {
				release() // the bytes are out of the region (or never will be)
			}
			if err != nil {
				return
			}
		default:
			return
		}
	}
}

// readLen reads a frame's u16 length into buf; false: it could not, or the
// length is over max.
func readLen(r io.Reader, buf []byte, max int) (int, bool) {
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return 0, false
	}
	n := int(binary.BigEndian.Uint16(buf[:2]))
	return n, n <= max
}

// tuneConn sets a data connection's options: no Nagle delay for the small
// frames, and socket buffers large enough to keep a READ's bytes moving.
func tuneConn(tc *net.TCPConn) {
	tc.SetNoDelay(true)
	tc.SetReadBuffer(4 << 20)
	tc.SetWriteBuffer(4 << 20)
}
