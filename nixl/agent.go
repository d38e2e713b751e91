//go:build nixl || nixlfake

package nixl

/*
#include <stdlib.h>
#include "cnixl.h"
*/
import "C"

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/ptimer"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// maxInbox bounds the notifications the progress goroutine keeps for
// DrainNotifs; past it they are counted and dropped (a producer that never
// drains would otherwise grow without bound).
const maxInbox = 1 << 16

// Agent is an xfer.DataTransport over a NIXL agent. It is safe for
// concurrent use.
type Agent struct {
	cfg    Config
	region *cache.Region
	meta   []byte
	desc   []byte
	touch  wire.Blocks // the touch page (cnixl_register), as peers READ it

	touchPage unsafe.Pointer // the touch page, C's: tests read it

	// cmu serializes every call into C; mu guards the state below. Who
	// needs both takes cmu first, and the progress goroutine holds mu
	// only between its calls into C. Unless Config.SyncPost, the step
	// loop's calls (PostRead, Check, Release, Add/RemoveRemotePeer, and
	// DrainNotifs when C is busy) take mu alone, and cmu only with
	// TryLock: a long C call, such as a post over UCX shared memory, which
	// copies there, or a progress call over UCX tcp, which moves bytes,
	// never holds up the caller's step.
	cmu     sync.Mutex
	mu      sync.Mutex
	c       *C.cnixl_agent
	async   bool              // the progress goroutine makes the step's calls into C (not SyncPost)
	inline  int               // async: the most blocks a READ posted in the step may have (InlinePost)
	peers   map[string]peer   // remote agent -> registration
	byMeta  map[string]string // metadata blob -> remote agent loaded from it
	claims  map[string]claim  // agent name a metadata blob gives -> its registrations
	handles map[xfer.Handle]*req
	queued  []*req           // accepted by PostRead, not yet posted (async)
	peerOps []peerOp         // loads and removals of remote agents, for the progress goroutine (async)
	loads   uint64           // async peers made, for their keys
	ended   []C.cnixl_handle // released after they ended, to release in C (async)
	zombies []C.cnixl_handle // released while running: released once they end
	touches []touchReq       // touch READs (touchC) not ended yet
	inbox   []xfer.Notif     // drained by the progress goroutine, for DrainNotifs
	dropped uint64           // notifications over maxInbox
	next    xfer.Handle
	closed  bool
	ids     []C.int32_t // PostRead's scratch (a fresh one cost 0.2 ms per 8,192-block READ here)

	checking []*req // checkEndsC's scratch, for the progress goroutine
	checkSts []int

	beforePost func() // tests: runs before the progress goroutine posts a READ

	expect  atomic.Int64  // reads a producer expects (ExpectReads)
	credit  atomic.Int64  // peers' notifications that may still count as work (notifWorks)
	grantAt atomic.Int64  // when the newest grant was made (UnixNano; granted)
	parked  atomic.Bool   // tests: the progress goroutine waits (idle, or its pause), holding no lock
	wakeups atomic.Uint64 // tests: the progress goroutine's returns from a pause or idle wait
	spun    atomic.Int64  // tests: nanoseconds the progress goroutine spent in rounds it did not pause after
	counted atomic.Uint64 // tests: peers' notifications that counted as work (notifWorks)
	wake    chan struct{} // wakes the progress goroutine from a pause or idle wait
	ready   chan struct{} // notifications wait in the inbox
	stop    chan struct{}
	done    chan struct{} // closed when the progress goroutine returned
}

// touchReq is a touch READ of peer (NIXL's name; "" once that agent was
// removed) that had not ended when last seen.
type touchReq struct {
	ch   C.cnixl_handle
	peer string
}

// errPeerGoneBeforePost is why a READ whose producer was removed before
// its post failed.
var errPeerGoneBeforePost = fmt.Errorf("nixl: the producer was removed before the READ was posted: %w", xfer.ErrUnknownPeer)

// req is a READ; ended says Check saw it end, so Release need not ask
// NIXL again.
type req struct {
	ch    C.cnixl_handle
	ended bool
	seen  bool // the progress loop saw it end, with status st
	st    int

	// Async READs: queued until the progress goroutine posts them.
	phase    postPhase
	released bool  // released before its post returned
	refused  bool  // NIXL refused its post: no request
	why      error // why it was refused before NIXL saw it, if it was
	ids      []C.int32_t
	agent    string
	notif    []byte
}

// postPhase is where an async READ is: queued, being posted (a C call
// under way), or posted.
type postPhase uint8

const (
	posted postPhase = iota
	queued
	posting
)

type peer struct {
	refs   int    // registrations
	blocks int    // valid remote ids are [0, blocks)
	name   string // NIXL's name for it; "" while its load is queued (async)
	agent  string // the name its metadata gives, which it claims
	failed error  // its load failed (async): READs are refused
	// loading: its load is queued or under way (async). Removed then, it
	// keeps its claim until the load is undone (runPeerOp).
	loading bool
}

// claim is the registrations of one agent name, all from one metadata
// blob and of one layout of its blocks. NIXL keeps a peer's state, and
// cnixl its blocks, under the name its metadata gives: a second blob (or
// the same blob with other blocks, which anyone holding the blob can
// send) naming a loaded agent would replace its connection or its
// blocks, or, if the rest of it failed to load, drop the agent; and a
// failed load keeps what it loaded before failing, which a later load of
// the name then trips over. So a blob is loaded only if no registration
// of another blob or layout claims its name, the claim lasts until what
// its load did is undone, and what a failed load left is dropped at once.
type claim struct {
	md     string
	layout string // layoutOf the blocks
	refs   int
}

// layoutOf names a registration's blocks: the shape when regular, else
// the (address, length, device) triples.
func layoutOf(shape wire.Blocks, regular bool, flat []C.uint64_t) string {
	if regular {
		return fmt.Sprintf("shape %d %d %d %d", shape.Base, shape.Size, shape.Count, shape.Device)
	}
	b := make([]byte, 0, 5+8*len(flat))
	b = append(b, "list "...)
	for _, v := range flat {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return string(b)
}

// mdAgent returns the agent name a load of metadata would register.
func mdAgent(metadata []byte) (string, error) {
	var name *C.char
	if len(metadata) == 0 || C.cnixl_md_agent(unsafe.Pointer(unsafe.SliceData(metadata)), C.size_t(len(metadata)), &name) != 0 {
		return "", fmt.Errorf("%w: the metadata names no agent", errInvalidParam)
	}
	defer C.cnixl_free(unsafe.Pointer(name))
	return C.GoString(name), nil
}

// claimable checks that metadata, naming agent name, with blocks of
// layout, may be registered; the caller holds mu.
func (a *Agent) claimable(name string, metadata []byte, layout string) error {
	if name == a.cfg.Name {
		return fmt.Errorf("%w: the metadata names this agent itself, %q", errInvalidParam, name)
	}
	c, ok := a.claims[name]
	switch {
	case !ok:
	case c.md != string(metadata):
		return fmt.Errorf("%w: the metadata names agent %q, registered already from other metadata "+
			"(two producers with one agent name, or one restarted while still registered)", errInvalidParam, name)
	case c.layout != layout:
		return fmt.Errorf("%w: agent %q is registered already with other blocks", errInvalidParam, name)
	}
	return nil
}

// claimName counts one more registration of name from metadata with
// blocks of layout; releaseName one less. The caller holds mu.
func (a *Agent) claimName(name string, metadata []byte, layout string) {
	c := a.claims[name]
	if c.refs == 0 {
		c.md, c.layout = string(metadata), layout
	}
	c.refs++
	a.claims[name] = c
}

// forget drops what a failed load of name's metadata left in NIXL; the
// caller holds cmu.
func (a *Agent) forget(name string) {
	n := C.CString(name)
	C.cnixl_forget_remote(a.c, n)
	C.free(unsafe.Pointer(n))
}

func (a *Agent) releaseName(name string) {
	if c := a.claims[name]; c.refs > 1 {
		c.refs--
		a.claims[name] = c
	} else {
		delete(a.claims, name)
	}
}

// peerOp is a call into C that AddRemotePeer or RemoveRemotePeer left to
// the progress goroutine (async): load the remote agent of peer key, or,
// with remove, remove NIXL's agent name.
type peerOp struct {
	key     string
	remove  bool
	notify  bool       // send peer key the notification md (Notify)
	connect chan error // non-nil: connect to peer key (loaded before), and say how it went; md the notification, shape the touch page
	name    string     // remove: NIXL's agent name; a load: the name its metadata gives
	release string     // remove: the claim to release once done
	md      []byte
	shape   wire.Blocks
	regular bool
	flat    []C.uint64_t
	n       int
}

var _ xfer.DataTransport = (*Agent)(nil)

func (c *Config) setDefaults() {
	if c.Backend == "" {
		c.Backend = "UCX"
	}
	if c.ProgressDelay <= 0 {
		if c.Progress == ProgressThread {
			c.ProgressDelay = time.Millisecond
		} else {
			c.ProgressDelay = defaultProgressDelay
		}
	}
	if c.Spin <= 0 {
		c.Spin = 50 * time.Microsecond
	}
	if c.IdlePoll <= 0 {
		c.IdlePoll = 50 * time.Millisecond
	}
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = 5 * time.Second
	}
	if c.InlinePost == 0 {
		c.InlinePost = 256 << 10
	}
}

// New creates a NIXL agent over region: it registers the region and
// prepares one descriptor per block. The region must stay mapped until
// Close returns.
func New(cfg Config, region *cache.Region) (*Agent, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: %w: agent name required", xfer.ErrBadConfig, errInvalidParam)
	}
	if region == nil {
		return nil, fmt.Errorf("%w: %w: nil region", xfer.ErrBadConfig, errInvalidParam)
	}
	if cfg.Progress < ProgressGoroutine || cfg.Progress > ProgressCaller {
		return nil, fmt.Errorf("%w: %w: progress mode %d", xfer.ErrBadConfig, errInvalidParam, int(cfg.Progress))
	}
	cfg.setDefaults()
	params := cfg.Params
	name, backend := C.CString(cfg.Name), C.CString(cfg.Backend)
	defer C.free(unsafe.Pointer(name))
	defer C.free(unsafe.Pointer(backend))
	n := len(params)
	keys := C.malloc(C.size_t(max(n, 1)) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	vals := C.malloc(C.size_t(max(n, 1)) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	defer C.free(keys)
	defer C.free(vals)
	ks, vs := unsafe.Slice((**C.char)(keys), max(n, 1)), unsafe.Slice((**C.char)(vals), max(n, 1))
	i := 0
	for k, v := range params {
		ks[i], vs[i] = C.CString(k), C.CString(v)
		defer C.free(unsafe.Pointer(ks[i]))
		defer C.free(unsafe.Pointer(vs[i]))
		i++
	}
	pt, delay := C.int(0), C.uint64_t(0)
	if cfg.Progress == ProgressThread {
		pt, delay = 1, C.uint64_t(cfg.ProgressDelay/time.Microsecond)
	}
	a := &Agent{cfg: cfg, region: region, peers: map[string]peer{}, byMeta: map[string]string{}, claims: map[string]claim{},
		handles: map[xfer.Handle]*req{}, wake: make(chan struct{}, 1), ready: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}),
		async: cfg.Progress == ProgressGoroutine && !cfg.SyncPost, inline: -1}
	if cfg.InlinePost >= 0 {
		a.inline = cfg.InlinePost / region.BlockSize()
	}
	if err := open(); err != nil {
		return nil, err
	}
	if st := C.cnixl_agent_new(name, backend, (**C.char)(keys), (**C.char)(vals), C.int(n), pt, delay, &a.c); st != 0 {
		err := statusErr("create agent", int(st))
		if hint := backendHint(cfg); hint != "" {
			err = fmt.Errorf("%w: %s", err, hint)
		}
		return nil, err
	}
	if st := C.cnixl_register(a.c, C.uintptr_t(region.Base()), C.uint64_t(region.BlockSize()), C.uint64_t(region.Blocks())); st != 0 {
		C.cnixl_agent_destroy(a.c)
		return nil, statusErr("register region", int(st))
	}
	var md unsafe.Pointer
	var mdlen C.size_t
	if st := C.cnixl_local_md(a.c, &md, &mdlen); st != 0 {
		C.cnixl_agent_destroy(a.c)
		return nil, statusErr("local metadata", int(st))
	}
	a.meta = C.GoBytes(md, C.int(mdlen)) // C's buffer, copied
	C.cnixl_free(md)
	a.touchPage = C.cnixl_touch_page(a.c)
	a.touch = wire.Blocks{Base: uint64(uintptr(a.touchPage)), Size: C.CNIXL_TOUCH_LEN, Count: 1}
	a.desc = wire.AppendBlockDescs(nil, uint64(region.Base()), uint64(region.BlockSize()), region.Blocks(), 0)
	if cfg.Progress == ProgressGoroutine {
		go a.progressLoop()
	} else {
		close(a.done)
	}
	return a, nil
}

// open loads NIXL (EnvLib), or says what is missing.
func open() error {
	path := os.Getenv(EnvLib)
	var cpath *C.char
	if path != "" {
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			path = filepath.Join(path, C.CNIXL_LIB)
		}
		cpath = C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
	}
	var msg *C.char
	if C.cnixl_open(cpath, &msg) == C.CNIXL_SUCCESS {
		return nil
	}
	detail := C.GoString(msg)
	C.cnixl_free(unsafe.Pointer(msg))
	fix := fmt.Sprintf("put NIXL's lib folder (holding %s) in LD_LIBRARY_PATH or the binary's rpath, or set %s to it",
		C.CNIXL_LIB, EnvLib)
	if path != "" {
		fix = fmt.Sprintf("%s=%s: set it to NIXL's %s or its folder, or unset it to search LD_LIBRARY_PATH and the binary's rpath",
			EnvLib, os.Getenv(EnvLib), C.CNIXL_LIB)
	}
	return fmt.Errorf("%w: %s; %s (docs/nixl.md)", ErrNotInstalled, detail, fix)
}

// AgentMetadata implements xfer.DataTransport.
func (a *Agent) AgentMetadata() []byte { return a.meta }

// MemDescriptor implements xfer.DataTransport.
func (a *Agent) MemDescriptor() []byte { return a.desc }

// expectReads implements plane.Driven: a producer says how many grants are
// live, and while any is, the progress goroutine drives the agent (see
// Config.ProgressDelay). More grants than before count as new ones (see
// granted), and it reports whether there were. Only the producer's step
// calls it.
func (a *Agent) expectReads(n int) bool {
	k := max(int64(n)-a.expect.Swap(int64(n)), 0)
	if k == 0 {
		a.lend(0) // fewer grants: no more counts than are live
		return false
	}
	a.granted(k)
	return true
}

// granted says k grants were made: a peer's READ may come soon. It wakes
// the progress goroutine from its pause, its pauses start again from
// their shortest, and their cap is timed from now (see readPause): a
// grant, not a peer's notification, is what keeps a producer driven
// closely. It lends each grant a count (lend).
func (a *Agent) granted(k int64) {
	a.grantAt.Store(time.Now().UnixNano())
	a.lend(k)
	a.kick()
}

// lend adds k counts, one per grant made, to those that let a peer's
// notification count as work (notifWorks), keeping them no more than
// grants are live. A step that replaced grants that ended says only that
// it granted (plane.Driven), and lends one.
func (a *Agent) lend(k int64) {
	for {
		c := a.credit.Load()
		if a.credit.CompareAndSwap(c, min(c+k, a.expect.Load())) {
			return
		}
	}
}

// readyChan implements plane.Signaling: the channel receives when the progress
// goroutine has notifications waiting for DrainNotifs, or a READ posted
// here ended (the goroutine saw it end, or it ended within its post). In
// the modes without the goroutine it is nil, and loops poll.
func (a *Agent) readyChan() <-chan struct{} {
	if a.cfg.Progress != ProgressGoroutine {
		return nil
	}
	return a.ready
}

// signal tells the loop that there is work (Ready).
func (a *Agent) signal() {
	select {
	case a.ready <- struct{}{}:
	default:
	}
}

// lockC takes both locks, for calls into C; unlockC releases them.
func (a *Agent) lockC()   { a.cmu.Lock(); a.mu.Lock() }
func (a *Agent) unlockC() { a.mu.Unlock(); a.cmu.Unlock() }

func (a *Agent) kick() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// AddRemotePeer implements xfer.DataTransport: it loads the remote agent
// and its blocks from the mem descriptor, which must not be empty. A
// descriptor of back-to-back blocks of one size (a region's, as
// wire.AppendBlockDescs writes it) is kept as its shape; any other as a
// list, which NIXL prepares. NIXL checks the blocks against the remote's
// registered memory when it prepares a list, else when a READ is posted.
func (a *Agent) AddRemotePeer(metadata, memDescriptor []byte) (xfer.Peer, error) {
	shape, regular, err := wire.DecodeBlocks(memDescriptor)
	if err != nil {
		return xfer.Peer{}, fmt.Errorf("nixl: mem descriptor: %w", err)
	}
	var flat []C.uint64_t
	n := shape.Count
	if !regular {
		if flat, err = flatDescs(memDescriptor); err != nil {
			return xfer.Peer{}, err
		}
		n = len(flat) / 3
	}
	return a.addPeer(metadata, shape, regular, flat, n)
}

// addRemotePeerShape implements plane.ShapedPeers: AddRemotePeer of the
// descriptor shape stands for, which it never builds.
func (a *Agent) addRemotePeerShape(metadata []byte, shape wire.Blocks) (xfer.Peer, error) {
	if shape.Size == 0 || shape.Count < 0 || shape.Size > (math.MaxUint64-shape.Base)/uint64(max(shape.Count, 1)) {
		return xfer.Peer{}, fmt.Errorf("%w: shape %+v", errInvalidParam, shape)
	}
	return a.addPeer(metadata, shape, true, nil, shape.Count)
}

// addPeer registers a producer of n blocks: shape's when regular, else
// flat's (address, length, device) triples.
func (a *Agent) addPeer(metadata []byte, shape wire.Blocks, regular bool, flat []C.uint64_t, n int) (xfer.Peer, error) {
	if n == 0 || len(metadata) == 0 {
		return xfer.Peer{}, fmt.Errorf("%w: empty metadata or descriptor", errInvalidParam)
	}
	if n > math.MaxInt32 {
		return xfer.Peer{}, fmt.Errorf("%w: %d descriptors", errInvalidParam, n)
	}
	name, err := mdAgent(metadata)
	if err != nil {
		return xfer.Peer{}, err
	}
	layout := layoutOf(shape, regular, flat)
	if a.async {
		return a.addPeerAsync(metadata, name, layout, shape, regular, flat, n)
	}
	a.lockC()
	defer a.unlockC()
	if a.closed {
		return xfer.Peer{}, xfer.ErrClosed
	}
	if err := a.claimable(name, metadata, layout); err != nil {
		return xfer.Peer{}, err
	}
	if agent, ok := a.byMeta[string(metadata)]; ok && a.peers[agent].blocks == n {
		// Loaded already by another registration: share it.
		p := a.peers[agent]
		p.refs++
		a.peers[agent] = p
		a.claimName(name, metadata, layout)
		return xfer.Peer{Agent: agent, Blocks: n}, nil
	}
	var cname *C.char
	md, mdlen := unsafe.Pointer(unsafe.SliceData(metadata)), C.size_t(len(metadata))
	var st C.int
	if regular {
		st = C.cnixl_load_remote_blocks(a.c, md, mdlen, C.uint64_t(shape.Base), C.uint64_t(shape.Size),
			C.uint64_t(n), C.uint64_t(shape.Device), &cname)
	} else {
		st = C.cnixl_load_remote(a.c, md, mdlen, unsafe.SliceData(flat), C.size_t(n), &cname)
	}
	if st != 0 {
		a.forget(name)
		return xfer.Peer{}, loadErr(metadata, int(st))
	}
	agent := C.GoString(cname)
	C.cnixl_free(unsafe.Pointer(cname))
	p := a.peers[agent]
	p.refs++
	p.blocks = n // a reload replaces the descriptor list
	p.name, p.agent = agent, name
	a.peers[agent] = p
	a.byMeta[string(metadata)] = agent
	a.claimName(name, metadata, layout)
	return xfer.Peer{Agent: agent, Blocks: n}, nil
}

// flatDescs decodes a mem descriptor into (addr, len, dev) triples for C.
func flatDescs(memDescriptor []byte) ([]C.uint64_t, error) {
	descs, err := wire.DecodeMemDescs(memDescriptor)
	if err != nil {
		return nil, fmt.Errorf("nixl: mem descriptor: %w", err)
	}
	flat := make([]C.uint64_t, 0, 3*len(descs))
	for _, d := range descs {
		addr, ok1 := d.Addr.Uint64()
		size, ok2 := d.Size.Uint64()
		dev, ok3 := d.Device.Uint64()
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("%w: negative value in the descriptor", errInvalidParam)
		}
		flat = append(flat, C.uint64_t(addr), C.uint64_t(size), C.uint64_t(dev))
	}
	return flat, nil
}

// addPeerAsync is AddRemotePeer without Config.SyncPost: the load (NIXL's
// loadRemoteMD, 2-8 ms over UCX here) is left to the progress goroutine,
// so the step that took a producer's first ack never waits for it. The
// peer's key is ours, not NIXL's name for it, which only the load tells.
// READs posted meanwhile are queued behind the load; if it fails they end
// Failed, and PostRead refuses later ones with xfer.ErrUnknownPeer (the
// consumer session then registers the producer again).
func (a *Agent) addPeerAsync(metadata []byte, name, layout string, shape wire.Blocks, regular bool, flat []C.uint64_t, n int) (xfer.Peer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return xfer.Peer{}, xfer.ErrClosed
	}
	if err := a.claimable(name, metadata, layout); err != nil {
		return xfer.Peer{}, err
	}
	a.claimName(name, metadata, layout)
	if key, ok := a.byMeta[string(metadata)]; ok {
		if p := a.peers[key]; p.blocks == n && p.failed == nil {
			p.refs++
			a.peers[key] = p
			return xfer.Peer{Agent: key, Blocks: n}, nil
		}
	}
	a.loads++
	key := fmt.Sprintf("%s/peer-%d", a.cfg.Name, a.loads)
	a.peers[key] = peer{refs: 1, blocks: n, agent: name, loading: true}
	a.byMeta[string(metadata)] = key
	a.peerOps = append(a.peerOps, peerOp{key: key, name: name, md: bytes.Clone(metadata), shape: shape, regular: regular, flat: flat, n: n})
	a.kick()
	return xfer.Peer{Agent: key, Blocks: n}, nil
}

// runPeerOp makes op's call into C; the caller holds cmu, not mu.
func (a *Agent) runPeerOp(op peerOp) {
	if op.connect != nil {
		op.connect <- a.connectC(op.key, op.md, op.shape)
		return
	}
	if op.notify {
		_ = a.notifyC(op.key, op.md) // one not sent is lost, as any notification may be
		return
	}
	if op.remove {
		a.mu.Lock()
		inUse := false
		for _, p := range a.peers {
			inUse = inUse || p.name == op.name // loaded again since
		}
		a.mu.Unlock()
		if !inUse {
			n := C.CString(op.name)
			C.cnixl_remove_remote(a.c, n)
			C.free(unsafe.Pointer(n))
		}
		if op.release != "" {
			a.mu.Lock()
			a.releaseName(op.release)
			a.mu.Unlock()
		}
		return
	}
	a.mu.Lock()
	_, live := a.peers[op.key]
	if !live { // removed before its load: nothing to undo
		a.releaseName(op.name)
	}
	a.mu.Unlock()
	if !live {
		return
	}
	var name *C.char
	md, mdlen := unsafe.Pointer(unsafe.SliceData(op.md)), C.size_t(len(op.md))
	var st C.int
	if op.regular {
		st = C.cnixl_load_remote_blocks(a.c, md, mdlen, C.uint64_t(op.shape.Base), C.uint64_t(op.shape.Size),
			C.uint64_t(op.n), C.uint64_t(op.shape.Device), &name)
	} else {
		st = C.cnixl_load_remote(a.c, md, mdlen, unsafe.SliceData(op.flat), C.size_t(op.n), &name)
	}
	var agent string
	if st == 0 {
		agent = C.GoString(name)
		C.cnixl_free(unsafe.Pointer(name))
	} else {
		a.forget(op.name)
	}
	a.mu.Lock()
	p, live := a.peers[op.key]
	p.loading = false
	switch {
	case st != 0 && live:
		p.failed = loadErr(op.md, int(st))
		a.peers[op.key] = p
		if a.byMeta[string(op.md)] == op.key {
			delete(a.byMeta, string(op.md))
		}
	case st == 0 && live:
		p.name = agent
		a.peers[op.key] = p
	case st == 0:
		// Removed while it loaded: undo the load, after what is queued,
		// and only then let the name be claimed by other metadata.
		a.peerOps = append(a.peerOps, peerOp{remove: true, name: agent, release: op.name})
		a.kick()
	default: // removed while its load failed, which forget undid
		a.releaseName(op.name)
	}
	a.mu.Unlock()
}

// connectC has NIXL connect to peer key, then sends it notif (bound to
// no READ: NIXL's genNotif), which sets up the path notifications take:
// over UCX, a READ's notification otherwise pays for it, 3-4 ms here;
// then it reads the peer's touch page, if it named one (see touchC). The
// caller holds cmu, not mu.
func (a *Agent) connectC(key string, notif []byte, touch wire.Blocks) error {
	a.mu.Lock()
	p, live := a.peers[key]
	a.mu.Unlock()
	switch {
	case !live || p.refs == 0:
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, key)
	case p.failed != nil:
		return fmt.Errorf("%w: %s: %w", xfer.ErrUnknownPeer, key, p.failed)
	case p.name == "":
		return fmt.Errorf("%w: %s not loaded", xfer.ErrUnknownPeer, key)
	}
	n := C.CString(p.name)
	defer C.free(unsafe.Pointer(n))
	if err := statusErr("make connection", int(C.cnixl_make_connection(a.c, n))); err != nil {
		return err
	}
	if len(notif) > 0 {
		if err := statusErr("notify", int(C.cnixl_gen_notif(a.c, n, unsafe.Pointer(unsafe.SliceData(notif)), C.size_t(len(notif))))); err != nil {
			return err
		}
	}
	a.touchC(n, touch)
	return nil
}

// touchC reads the touch page a producer named (wire.XferAck.Touch) into
// our own, once, with no notification: over UCX the first READ towards a
// peer chooses its protocols, 0.3-0.7 ms here, and this one pays for it
// instead of the first fetch's. It writes nothing but our touch page. A
// page that is not one (more than one block, longer than ours, past the
// end of the address space) is not read, and a READ that fails costs
// nothing but the set-up it was for: the first fetch then pays, as
// without a touch page. A touch READ that has not ended is kept apart
// from the READs (touches): the agent releases it once it ended, is not
// driven for it, and Close waits for it only briefly, so that a producer
// that stops driving its agent costs the consumer nothing; one such READ
// per peer at most. The caller holds cmu, not mu; name is NIXL's for the
// peer.
func (a *Agent) touchC(name *C.char, touch wire.Blocks) {
	if touch.Count != 1 || touch.Size == 0 || touch.Size > C.CNIXL_TOUCH_LEN || touch.Size > math.MaxUint64-touch.Base {
		return
	}
	peer := C.GoString(name)
	a.mu.Lock()
	pending := slices.ContainsFunc(a.touches, func(t touchReq) bool { return t.peer == peer })
	a.mu.Unlock()
	if pending {
		return
	}
	var h C.cnixl_handle
	switch C.cnixl_post_touch(a.c, name, C.uint64_t(touch.Base), C.uint64_t(touch.Size), C.uint64_t(touch.Device), &h) {
	case C.CNIXL_SUCCESS:
		if C.cnixl_release(a.c, h) == 0 {
			return
		}
	case C.CNIXL_IN_PROG:
	default:
		return
	}
	a.mu.Lock()
	a.touches = append(a.touches, touchReq{ch: h, peer: peer})
	a.mu.Unlock()
}

// contact makes NIXL connect to a registered producer now (loading its
// metadata first, if that is still queued), instead of at its first READ:
// over UCX the connection cost the first READ 1-2.5 ms over shared
// memory and 11-18 ms over tcp here. By default the progress goroutine
// makes the call, after the loads queued before it; contact waits for it,
// or for ctx.
func (a *Agent) contact(ctx context.Context, key string, notif []byte, touch wire.Blocks) error {
	if err := a.connect(ctx, key, notif, touch); err != nil {
		return err
	}
	// makeConnection starts UCX's set-up of the connection, which moves
	// only while both agents are driven (the producer drives its own
	// after a contact request): drive ours a while. Over UCX tcp the first
	// fetch after a contact took 22-31 ms without this, 3-14 ms with it.
	t := time.NewTimer(contactSpin)
	defer t.Stop()
	tick := time.NewTicker(20 * time.Microsecond)
	defer tick.Stop()
	for {
		if a.async {
			a.kick()
		} else if err := a.driveC(); err != nil {
			return err
		}
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-a.stop:
			return xfer.ErrClosed
		case <-tick.C:
		}
	}
}

// Notify sends the registered producer agent notif with no READ (NIXL's
// genNotif), so that a consumer gives back a grant it will not READ and
// the producer unpins at once. Unless Config.SyncPost it returns at once,
// the progress goroutine sending it after what is queued before it; one
// it cannot send is lost, as any notification may be.
func (a *Agent) Notify(agent string, notif []byte) error {
	if !a.async {
		return a.underC(func() error { return a.notifyC(agent, notif) })
	}
	a.mu.Lock()
	switch p := a.peers[agent]; {
	case a.closed:
		a.mu.Unlock()
		return xfer.ErrClosed
	case p.refs == 0:
		a.mu.Unlock()
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	a.peerOps = append(a.peerOps, peerOp{key: agent, notify: true, md: bytes.Clone(notif)})
	a.mu.Unlock()
	a.kick()
	return nil
}

// notifyC sends peer key notif with genNotif; the caller holds cmu, not mu.
func (a *Agent) notifyC(key string, notif []byte) error {
	a.mu.Lock()
	p, live := a.peers[key]
	a.mu.Unlock()
	if !live || p.refs == 0 || p.failed != nil || p.name == "" {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, key)
	}
	n := C.CString(p.name)
	defer C.free(unsafe.Pointer(n))
	return statusErr("notify", int(C.cnixl_gen_notif(a.c, n, unsafe.Pointer(unsafe.SliceData(notif)), C.size_t(len(notif)))))
}

// connect has NIXL connect to peer key, sends it notif and reads its touch
// page (see connectC): on this goroutine under Config.SyncPost, else on
// the progress goroutine.
func (a *Agent) connect(ctx context.Context, key string, notif []byte, touch wire.Blocks) error {
	if !a.async {
		return a.underC(func() error { return a.connectC(key, notif, touch) })
	}
	done := make(chan error, 1)
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return xfer.ErrClosed
	}
	a.peerOps = append(a.peerOps, peerOp{key: key, connect: done, md: bytes.Clone(notif), shape: touch})
	a.mu.Unlock()
	a.kick()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-a.done:
		return xfer.ErrClosed
	}
}

// driveC drives the agent once under Config.SyncPost, as DrainNotifs does
// (the notifications it takes wait for DrainNotifs).
func (a *Agent) driveC() error {
	return a.underC(func() error {
		_, err := a.pollC()
		return err
	})
}

// underC runs f holding cmu, unless the agent is closed: Close waits for
// cmu before it destroys the agent.
func (a *Agent) underC(f func() error) error {
	a.cmu.Lock()
	defer a.cmu.Unlock()
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return xfer.ErrClosed
	}
	return f()
}

// contactSpin is how long contact drives the agent after NIXL's
// makeConnection.
const contactSpin = 30 * time.Millisecond

// touchCloseWait is how long Close waits for touch READs (touchC) that
// have not ended, when no other READ runs.
const touchCloseWait = 100 * time.Millisecond

// agentPlane is an Agent's side of the plumbing between a session and its
// data plane (package internal/plane).
type agentPlane struct{ a *Agent }

var (
	_ plane.Contacter   = agentPlane{}
	_ plane.Driven      = agentPlane{}
	_ plane.Signaling   = agentPlane{}
	_ plane.ShapedPeers = agentPlane{}
	_ plane.Named       = agentPlane{}
	_ plane.Explainer   = agentPlane{}
	_ plane.Toucher     = agentPlane{}
)

func init() {
	plane.Register(func(data any) any {
		if a, ok := data.(*Agent); ok {
			return agentPlane{a}
		}
		return nil
	})
}

// Name implements plane.Named: the agent's name, as peers address it.
func (c agentPlane) Name() string { return c.a.cfg.Name }

// FailedWhy implements plane.Explainer.
func (c agentPlane) FailedWhy(h xfer.Handle) error { return c.a.failedWhy(h) }

// ExpectReads implements plane.Driven (see Agent.expectReads).
func (c agentPlane) ExpectReads(n int, fresh bool) {
	if !c.a.expectReads(n) && fresh && n > 0 {
		c.a.granted(1) // grants that replaced ones ended in the same step
	}
}

// Ready implements plane.Signaling (see Agent.readyChan).
func (c agentPlane) Ready() <-chan struct{} { return c.a.readyChan() }

// AddRemotePeerShape implements plane.ShapedPeers (see
// Agent.addRemotePeerShape).
func (c agentPlane) AddRemotePeerShape(metadata []byte, shape wire.Blocks) (xfer.Peer, error) {
	return c.a.addRemotePeerShape(metadata, shape)
}

// Contact implements plane.Contacter. A producer over NIXL makes no
// contact grant (it does not attach): k.Notif is nil, and the notification
// sent names the contact alone (contactNotif), which a producer drops. A Go
// producer over NIXL names its touch page, which the contact reads.
func (c agentPlane) Contact(ctx context.Context, agent string, k plane.Contact) error {
	notif := k.Notif
	if notif == nil {
		notif = contactNotif(c.a.cfg.Name)
	}
	return c.a.contact(ctx, agent, notif, k.Touch)
}

// TouchPage implements plane.Toucher: CNIXL_TOUCH_LEN bytes of the
// agent's own, registered with the region and apart from it, zero.
func (c agentPlane) TouchPage() wire.Blocks { return c.a.touch }

// contactNotifLen is the least length of the notification a contact sends
// (see contactNotif).
const contactNotifLen = 160

// contactNotif is the notification a contact sends to a producer that
// made no contact grant: "<name>.<padding>:" + wirext.ContactHash, which
// producers drop (vLLM's as a grant it does not know). It is as long as a
// READ's notification, and that is the point: UCX sends a short active
// message straight into the peer's shared-memory queue, but a longer one
// needs the endpoint's message lane connected and endpoint ids exchanged
// with the producer, a round trip that waits on the producer's progress.
// A short contact notification left that to the first READ's: 2-3 ms over
// UCX shared memory here, against a steady fetch of 0.15 ms.
func contactNotif(name string) []byte {
	b := make([]byte, 0, contactNotifLen+len(name))
	b = append(b, name...)
	b = append(b, '.')
	for len(b) < contactNotifLen-len(wirext.ContactHash)-1 {
		b = append(b, '_')
	}
	return append(append(b, ':'), wirext.ContactHash...)
}

// RemoveRemotePeer implements xfer.DataTransport. Unless Config.SyncPost,
// the progress goroutine removes the agent from NIXL, after the loads and
// READs queued before, and NIXL's error, if any, is not reported.
func (a *Agent) RemoveRemotePeer(agent string) error {
	if a.async {
		a.mu.Lock()
		defer a.mu.Unlock()
	} else {
		a.lockC()
		defer a.unlockC()
	}
	if a.closed {
		return xfer.ErrClosed
	}
	p := a.peers[agent]
	if p.refs == 0 {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	if p.refs--; p.refs > 0 {
		a.releaseName(p.agent)
		a.peers[agent] = p
		return nil
	}
	if !p.loading {
		a.releaseName(p.agent) // else its load releases it once undone
	}
	delete(a.peers, agent)
	for m, n := range a.byMeta {
		if n == agent {
			delete(a.byMeta, m)
		}
	}
	// A touch READ of the agent removed no longer stands for the peer: a
	// producer loaded again under its name gets a touch of its own.
	for i := range a.touches {
		if a.touches[i].peer == p.name {
			a.touches[i].peer = ""
		}
	}
	if a.async {
		if p.name != "" { // else its load finds it gone
			a.peerOps = append(a.peerOps, peerOp{remove: true, name: p.name})
			a.kick()
		}
		return nil
	}
	n := C.CString(agent)
	defer C.free(unsafe.Pointer(n))
	return statusErr("remove remote", int(C.cnixl_remove_remote(a.c, n)))
}

// PostRead implements xfer.DataTransport. Every id must name a block of
// its region: local ones this agent's, remote ones the peer's
// (refused as an invalid parameter). Unless Config.SyncPost, a READ of more than
// Config.InlinePost bytes, one from a peer still loading, any READ while
// eight or more are held, and any READ while C is busy is queued for the
// progress goroutine, and PostRead returns at once; a queued READ NIXL
// refuses ends Failed.
func (a *Agent) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	if len(local) != len(remote) {
		return 0, xfer.ErrLengthMismatch
	}
	if len(local) == 0 {
		return 0, fmt.Errorf("nixl: post READ: %w: no blocks", errInvalidParam)
	}
	if !a.async {
		a.cmu.Lock()
		defer a.cmu.Unlock()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, xfer.ErrClosed
	}
	ids := slices.Grow(a.ids[:0], 2*len(local))[:2*len(local)]
	if len(ids) <= 2*a.region.Blocks() { // a READ naming blocks twice is not kept
		a.ids = ids
	}
	nlocal := min(a.region.Blocks(), math.MaxInt32)
	for i, id := range local {
		if id < 0 || id >= nlocal {
			return 0, fmt.Errorf("nixl: post READ: %w: local block %d of %d", errInvalidParam, id, nlocal)
		}
		ids[i] = C.int32_t(id)
	}
	p := a.peers[agent]
	if p.refs == 0 {
		return 0, fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	if p.failed != nil {
		return 0, fmt.Errorf("%w: %s: %w", xfer.ErrUnknownPeer, agent, p.failed)
	}
	for i, id := range remote {
		if id < 0 || id >= p.blocks {
			return 0, fmt.Errorf("nixl: post READ: %w: remote block %d of %d", errInvalidParam, id, p.blocks)
		}
		ids[len(local)+i] = C.int32_t(id)
	}
	if a.async {
		// In the step only if the READ is small enough that a copy within
		// the post is short, its peer loaded, fewer than inlineHeld
		// READs held, and C free.
		if p.name == "" || len(local) > a.inline || len(a.handles) >= inlineHeld || !a.cmu.TryLock() {
			a.next++
			r := &req{phase: queued, ids: slices.Clone(ids), agent: agent, notif: bytes.Clone(notif)}
			a.handles[a.next] = r
			a.queued = append(a.queued, r)
			a.kick()
			return a.next, nil
		}
		defer a.cmu.Unlock()
	}
	st, h := a.postLocked(ids, p.name, notif)
	if st < 0 {
		return 0, statusErr("post READ", st)
	}
	a.next++
	if st == C.CNIXL_SUCCESS {
		// Done within the post (UCX over shared memory copies there):
		// nothing to drive, nothing to ask NIXL again. Ready still says
		// a READ ended, as for any other.
		a.handles[a.next] = &req{ch: h, ended: true, seen: true, st: C.CNIXL_SUCCESS}
		a.signal()
		return a.next, nil
	}
	a.handles[a.next] = &req{ch: h}
	a.kick()
	return a.next, nil
}

// postLocked posts a READ of ids (local, then as many remote) from agent;
// the caller holds cmu. It returns NIXL's status and, unless negative, the
// request.
func (a *Agent) postLocked(ids []C.int32_t, agent string, notif []byte) (int, C.cnixl_handle) {
	n := C.CString(agent)
	defer C.free(unsafe.Pointer(n))
	var np unsafe.Pointer
	if len(notif) > 0 {
		np = unsafe.Pointer(unsafe.SliceData(notif))
	}
	var h C.cnixl_handle
	k := len(ids) / 2
	st := C.cnixl_post_read(a.c, &ids[0], &ids[k], C.int(k), n, np, C.size_t(len(notif)), &h)
	return int(st), h
}

// postQueued makes the peer loads and removals, then posts the READs,
// that AddRemotePeer, RemoveRemotePeer and PostRead queued, in order; the
// caller holds cmu, not mu. Both are taken at once: a READ is never taken
// without the load of its peer, queued before it. It reports whether it
// had anything to do, and whether any READ ended within its post (done,
// or refused).
func (a *Agent) postQueued() (did, ended bool) {
	a.mu.Lock()
	if a.closed || len(a.queued)+len(a.peerOps) == 0 {
		a.mu.Unlock()
		return false, false
	}
	ops, todo := a.peerOps, a.queued
	a.peerOps, a.queued = nil, nil
	for _, r := range todo {
		if !r.released {
			r.phase = posting
		}
	}
	a.mu.Unlock()
	for _, op := range ops {
		a.runPeerOp(op)
	}
	for _, r := range todo {
		if r.phase != posting { // released while queued: never posted
			continue
		}
		if a.beforePost != nil {
			a.beforePost()
		}
		a.mu.Lock()
		p, live := a.peers[r.agent]
		a.mu.Unlock()
		var st int
		var h C.cnixl_handle
		var why error
		if !live || p.failed != nil || p.name == "" {
			st = int(C.CNIXL_ERR_NOT_FOUND) // its peer is gone, or did not load
			switch {
			case !live:
				why = errPeerGoneBeforePost
			case p.failed != nil:
				why = fmt.Errorf("nixl: the producer's metadata did not load: %w", p.failed)
			default:
				why = errors.New("nixl: the producer's metadata had not loaded")
			}
		} else {
			st, h = a.postLocked(r.ids, p.name, r.notif)
		}
		a.mu.Lock()
		r.phase, r.ids, r.notif = posted, nil, nil
		switch {
		case st < 0: // refused: nothing runs, and there is no request
			r.ended, r.seen, r.st, r.refused, r.why = true, true, st, true, why
			ended = true
		case st == C.CNIXL_SUCCESS:
			r.ch, r.ended, r.seen, r.st = h, true, true, st
			ended = true
		default:
			r.ch = h
		}
		if r.released && !r.refused {
			// Released while its post ran: Release said it may still
			// write; the request goes once it has ended.
			a.zombies = append(a.zombies, h)
		}
		a.mu.Unlock()
	}
	return true, ended
}

// Check implements xfer.DataTransport. A READ NIXL reports failed is
// Failed; a request NIXL does not know is an error (the state is unknown).
// Unless Config.SyncPost, Check does not call into NIXL: the progress
// goroutine, which drives the agent while READs are outstanding, records
// when each ends.
func (a *Agent) Check(h xfer.Handle) (xfer.Progress, error) {
	if !a.async {
		a.cmu.Lock()
		defer a.cmu.Unlock()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.handles[h]
	if !ok {
		return 0, fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	if a.closed {
		return 0, xfer.ErrClosed
	}
	st := r.st
	if !r.seen {
		if a.async {
			return xfer.InProgress, nil
		}
		st = int(C.cnixl_check(a.c, r.ch))
	}
	switch {
	case st == C.CNIXL_IN_PROG:
		return xfer.InProgress, nil
	case st == C.CNIXL_SUCCESS:
		r.ended = true
		return xfer.Complete, nil
	case st == C.CNIXL_ERR_NOT_FOUND && !r.refused:
		return 0, statusErr("check", st)
	default:
		r.ended, r.st = true, st // st for FailedWhy
		return xfer.Failed, nil
	}
}

// failedWhy is NIXL's status of a READ Check said failed, as an error, or
// nil.
func (a *Agent) failedWhy(h xfer.Handle) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.handles[h]
	switch {
	case !ok || !r.ended:
		return nil
	case r.why != nil:
		return r.why
	case r.refused:
		return statusErr("post", r.st)
	}
	return statusErr("read", r.st)
}

// Release implements xfer.DataTransport. A READ still in progress is not
// handed to NIXL to abort (UCX cannot be trusted to have stopped a one-sided
// READ it says it canceled): the request is kept and released once it ends,
// and Release returns ErrMayStillWrite. A READ still queued for the
// progress goroutine is dropped, never posted. Unless Config.SyncPost, an
// ended READ's request is released here if C is free, else by the
// progress goroutine.
func (a *Agent) Release(h xfer.Handle) error {
	if !a.async {
		a.cmu.Lock()
		defer a.cmu.Unlock()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.handles[h]
	if !ok {
		return fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	if a.closed {
		// Close is waiting for it, and destroys it.
		return fmt.Errorf("%w: READ %d: agent closing", xfer.ErrMayStillWrite, h)
	}
	delete(a.handles, h)
	switch {
	case r.phase == queued:
		r.released = true // postQueued skips it
		return nil
	case r.phase == posting:
		r.released = true // postQueued keeps its request until it ends
		return fmt.Errorf("%w: READ %d being posted", xfer.ErrMayStillWrite, h)
	case r.refused:
		return nil
	case a.async:
		if r.seen && a.cmu.TryLock() {
			// Ended, and C is free: released here. Waking the progress
			// goroutine for it cost a quarter of the fetches at four in
			// flight over UCX shared memory here.
			st := int(C.cnixl_release(a.c, r.ch))
			a.cmu.Unlock()
			if st != 0 {
				a.zombies = append(a.zombies, r.ch)
				a.kick()
				return fmt.Errorf("%w: %w", xfer.ErrMayStillWrite, statusErr("release", st))
			}
			return nil
		}
		// The progress goroutine makes the calls into C.
		a.kick()
		if r.seen {
			a.ended = append(a.ended, r.ch)
			return nil
		}
		a.zombies = append(a.zombies, r.ch)
		return fmt.Errorf("%w: READ %d still in progress", xfer.ErrMayStillWrite, h)
	}
	if !r.ended && C.cnixl_check(a.c, r.ch) == C.CNIXL_IN_PROG {
		a.zombies = append(a.zombies, r.ch)
		return fmt.Errorf("%w: READ %d still in progress", xfer.ErrMayStillWrite, h)
	}
	if st := int(C.cnixl_release(a.c, r.ch)); st != 0 {
		a.zombies = append(a.zombies, r.ch)
		return fmt.Errorf("%w: %w", xfer.ErrMayStillWrite, statusErr("release", st))
	}
	return nil
}

// The functions named ...C call into C: the caller holds cmu, not mu,
// which they take only around the state they read or write, so that the
// step loop's calls that take mu alone (not Config.SyncPost) never wait for
// a call into C. A request's C handle is only ever used under cmu.

// releaseEndedC releases in C the requests of READs that ended and were
// released; one NIXL will not release is kept with the zombies.
func (a *Agent) releaseEndedC() {
	a.mu.Lock()
	todo := a.ended
	a.ended = nil
	a.mu.Unlock()
	var kept []C.cnixl_handle
	for _, ch := range todo {
		if C.cnixl_release(a.c, ch) != 0 {
			kept = append(kept, ch)
		}
	}
	if len(kept) > 0 {
		a.mu.Lock()
		a.zombies = append(a.zombies, kept...)
		a.mu.Unlock()
	}
}

// reapZombiesC releases the kept requests that have ended, touch READs'
// too.
func (a *Agent) reapZombiesC() {
	reapC(a, &a.touches, func(t touchReq) C.cnixl_handle { return t.ch })
	reapC(a, &a.zombies, func(h C.cnixl_handle) C.cnixl_handle { return h })
}

// reapC releases the requests of *kept (a's, guarded by mu) that have
// ended, and keeps the rest; h is a request's handle. The caller holds
// cmu, not mu.
func reapC[T any](a *Agent, kept *[]T, h func(T) C.cnixl_handle) {
	a.mu.Lock()
	todo := *kept
	*kept = nil
	a.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	still := todo[:0]
	for _, t := range todo {
		if C.cnixl_check(a.c, h(t)) == C.CNIXL_IN_PROG || C.cnixl_release(a.c, h(t)) != 0 {
			still = append(still, t)
		}
	}
	a.mu.Lock()
	*kept = append(still, *kept...) // and those kept meanwhile
	a.mu.Unlock()
}

// pollC drives the agent once (NIXL's getNotifs progresses the UCX
// workers) and keeps what arrived in the inbox. It reports whether anything
// arrived.
func (a *Agent) pollC() (bool, error) {
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.cnixl_get_notifs(a.c, &buf, &n); st != 0 {
		return false, statusErr("get notifications", int(st))
	}
	if n == 0 {
		return false, nil
	}
	if n > 1<<30 { // cannot be: records are bounded (CNIXL_MAX_NOTIF), and so is what one poll finds
		C.cnixl_free(buf)
		a.mu.Lock()
		a.dropped++
		a.mu.Unlock()
		return true, nil
	}
	b := C.GoBytes(buf, C.int(n))
	C.cnixl_free(buf)
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(b) >= 8 {
		nl := int(binary.NativeEndian.Uint32(b))
		if len(b) < 8+nl {
			break
		}
		name := string(b[4 : 4+nl])
		ml := int(binary.NativeEndian.Uint32(b[4+nl:]))
		if len(b) < 8+nl+ml {
			break
		}
		if len(a.inbox) < maxInbox {
			a.inbox = append(a.inbox, xfer.Notif{Agent: name, Msg: b[8+nl : 8+nl+ml : 8+nl+ml]})
		} else {
			a.dropped++
		}
		b = b[8+nl+ml:]
	}
	return true, nil
}

// DrainNotifs implements xfer.DataTransport.
// Unless Config.SyncPost, it drives the agent only if no call into C is
// under way, and otherwise returns what the progress goroutine drained.
func (a *Agent) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) {
	haveC := true
	if a.async {
		haveC = a.cmu.TryLock()
	} else {
		a.mu.Lock()
		closed := a.closed
		a.mu.Unlock()
		if closed { // Close may hold cmu a while: do not wait for it
			return dst, xfer.ErrClosed
		}
		a.cmu.Lock()
	}
	if haveC {
		defer a.cmu.Unlock()
	}
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed { // else Close waits for cmu before it destroys the agent
		return dst, xfer.ErrClosed
	}
	var err error
	if haveC {
		a.releaseEndedC()
		a.reapZombiesC()
		_, err = a.pollC()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	dst = append(dst, a.inbox...)
	clear(a.inbox)
	a.inbox = a.inbox[:0]
	return dst, err
}

// droppedNotifs is how many notifications were dropped because DrainNotifs
// was not called while more than 65,536 waited.
func (a *Agent) droppedNotifs() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dropped
}

// checkEndsC looks at READs posted here that have not ended and records
// those that did, so that a loop waiting on Ready wakes the moment one
// ends. It reports whether any did. It looks at most at checksPerRound of
// them per round, and Go's map order starts each round at a random place,
// so all are looked at over rounds.
func (a *Agent) checkEndsC() bool {
	a.mu.Lock()
	rs := a.checking[:0]
	for _, r := range a.handles {
		if r.ended || r.phase != posted || r.refused {
			continue
		}
		if rs = append(rs, r); len(rs) == checksPerRound {
			break
		}
	}
	a.mu.Unlock()
	// r.ch is set once the READ is posted, and released only by this
	// goroutine (or under cmu).
	sts := a.checkSts[:0]
	for _, r := range rs {
		sts = append(sts, int(C.cnixl_check(a.c, r.ch)))
	}
	ended := false
	a.mu.Lock()
	for i, r := range rs {
		if st := sts[i]; st != C.CNIXL_IN_PROG && st != C.CNIXL_ERR_NOT_FOUND && !r.seen {
			r.ended, r.seen, r.st, ended = true, true, st, true
		}
	}
	a.mu.Unlock()
	clear(rs)
	a.checking, a.checkSts = rs[:0], sts[:0]
	return ended
}

const checksPerRound = 32

// inlineHeld is how many READs held make PostRead hand every READ to the
// progress goroutine: with that many in flight the goroutine's posts
// batch while the step does the rest (64 fetches in flight over UCX
// shared memory, producer and consumer in one process, ran 32-41 %
// faster than posting in the step here; in two processes, and at 4 in
// flight, as fast).
const inlineHeld = 8

// readingLocked says whether a READ posted here may still be moving.
func (a *Agent) readingLocked() bool {
	for _, r := range a.handles {
		if !r.ended {
			return true
		}
	}
	return false
}

// busyLocked says whether the progress goroutine has something to drive,
// given whether READs of ours may still move (readingLocked): those,
// peers' READs of our memory, or requests to release. An ended READ the
// caller still holds is nothing.
func (a *Agent) busyLocked(reading bool) bool {
	return reading || len(a.zombies) > 0 || len(a.ended) > 0 || a.expect.Load() > 0
}

// defaultProgressDelay is ProgressGoroutine's longest pause.
const defaultProgressDelay = 10 * time.Millisecond

// The progress goroutine's pauses, after its spin: each twice the last,
// from firstPause (grantPause). While READs are outstanding, this agent's
// own or peers' of its live grants, they stop growing at readPause, or a
// readLag-th of the time since the last event (a post, an end, a
// notification that counts, see notifWorks, a kick) if that is longer: an
// end is seen at most 1 ms, or 5 %, late. For peers' READs the time is
// counted from the newest grant (granted), and from later events only
// while that grant is younger than youngGrant: otherwise a peer holding a
// grant it never reads could keep us waking every millisecond by sending
// a notification every 20 ms. A peer's READ needs us driven as much as
// our own does: over UCX tcp its bytes, and under UCX's default transports its notification and
// the flush that ends it, move only while we drive; with pauses growing
// to ProgressDelay instead, a fetch one at a time from another process
// took 10 ms over NIXL's default transports here, 0.5 ms with these. Each
// wake-up cost 45-135 µs of CPU on this VM (a Go timer's or a timerfd's
// alike, longer sleeps dearer): a READ that hangs, or a grant never read,
// would cost a tenth of a core at 1 ms; growing with the time, they cost
// about 1 % of a core after 200 ms.
const (
	firstPause = 25 * time.Microsecond
	readPause  = time.Millisecond
	readLag    = 20
)

// youngGrant is how long after a grant the progress goroutine's pauses
// are timed from the last event as well (see readPause), and a peer's
// notification starts them again from their shortest (oldGrantsOnly).
const youngGrant = 100 * time.Millisecond

// oldGrantsOnly says whether all the progress goroutine drives for is
// peers' grants, the newest older than youngGrant. A peer's notification
// then leaves its pauses growing (it is seen at most a readLag-th of the
// grant's age late), so that a peer sending notifications fast cannot
// keep a producer waking every few hundred microseconds.
func (a *Agent) oldGrantsOnly(now time.Time, reading bool) bool {
	return !reading && a.expect.Load() > 0 && a.grantAge(now) >= youngGrant
}

// notifWorks says whether a peer's notification, just seen, counts as
// work: whether it restarts the spin and the pauses, and their cap's
// clock (see readPause). Only grants' notifications can: one per grant
// made (granted) and no more than grants are live, and, unless READs of
// our own are outstanding, only while the newest grant is young
// (oldGrantsOnly). A peer that sends notifications as fast as it can then
// costs a spin per grant made, never a core. A READ of our own ends by
// itself (checkEndsC): with no grant live, no notification counts.
func (a *Agent) notifWorks(now time.Time, reading bool) bool {
	if a.oldGrantsOnly(now, reading) {
		return false
	}
	for {
		c := a.credit.Load()
		if c <= 0 {
			return false
		}
		if a.credit.CompareAndSwap(c, c-1) {
			a.counted.Add(1)
			return true
		}
	}
}

// grantAge is the time since the newest grant (granted).
func (a *Agent) grantAge(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, a.grantAt.Load()))
}

// grantPause is the first pause, and a new grant's wake-up spins none,
// while only a producer's grants are live: a peer's READ, or its
// notification, comes a round trip and the peer's step after the grant at
// the earliest, and shorter pauses only cost wake-ups.
const grantPause = 200 * time.Microsecond

// movedCall is how long a progress call must take to count as one that
// moved bytes. Over UCX tcp a call here that moved a READ's bytes, on
// either side, took 0.1-350 ms; an idle one 0.2-1.6 µs back to back, but
// mostly 20-100 µs, now and then up to 400 µs, as the first call after a
// pause (a thread fresh from a sleep, on this VM): such a one costs a
// spin and pauses started over.
const movedCall = 200 * time.Microsecond

// progressLoop drives the agent for ProgressGoroutine. After a round that
// found work (a READ posted or ended, a notification that counts, see
// notifWorks, a progress call that moved bytes, a kick while READs of its
// own are outstanding) it goes on round after round, yielding between
// them, for Config.Spin; then it
// pauses on a precise timer, each pause twice the last, up to
// ProgressDelay, and while READs of its own are outstanding up to
// readPause at first (see above). With nothing to drive it polls every
// IdlePoll. A kick wakes it from any pause.
func (a *Agent) progressLoop() {
	defer close(a.done)
	idle := time.NewTimer(a.cfg.IdlePoll)
	defer idle.Stop()
	// A Go timer under a millisecond fires about a millisecond late when
	// the process has nothing else to run: the runtime then waits for it
	// in epoll_wait, whose timeout is whole milliseconds (Go 1.26: a
	// 50 µs timer fired 1.01-1.07 ms late here; ptimer's 25-50 µs).
	pause := ptimer.New()
	defer pause.Close()
	worked := time.Now() // the last round that found work
	event := worked      // the last post, end, counted notification or kick
	var wait time.Duration
	kicked := false
	for {
		a.cmu.Lock()
		posted, ended := false, false
		if a.async {
			posted, ended = a.postQueued()
		}
		a.mu.Lock()
		closed := a.closed
		a.mu.Unlock()
		if closed {
			a.cmu.Unlock()
			return
		}
		t0 := time.Now()
		notified, _ := a.pollC()
		moved := time.Since(t0) > movedCall
		ended = a.checkEndsC() || ended
		if notified || ended {
			a.signal()
		}
		a.releaseEndedC()
		a.reapZombiesC()
		a.mu.Lock()
		reading := a.readingLocked()
		busy := a.busyLocked(reading)
		a.mu.Unlock()
		a.cmu.Unlock()
		now := time.Now()
		works := notified && a.notifWorks(now, reading)
		// A call that met a flood of notifications is slow for them: it
		// counts as moving bytes only if they count as work.
		moved = moved && (!notified || works)
		if works || ended || posted {
			event = now
		}
		if ended || posted || moved || kicked && reading || works {
			worked, wait = now, 0
		}
		kicked = false
		switch {
		case !busy:
			wait = 0
			idle.Reset(a.cfg.IdlePoll)
			a.parked.Store(true)
			select {
			case <-a.stop:
				return
			case <-a.wake:
				event, kicked = time.Now(), true
			case <-idle.C:
			}
			a.parked.Store(false)
			a.wakeups.Add(1)
		case now.Sub(worked) < a.cfg.Spin:
			runtime.Gosched()
			a.spun.Add(int64(time.Since(t0)))
		default:
			limit := a.cfg.ProgressDelay
			switch {
			case reading:
				limit = min(limit, max(readPause, now.Sub(event)/readLag))
			case a.expect.Load() > 0:
				// Timed from the newest grant, or from the last event
				// while that grant is young (its READ's set-up and
				// notification are events): a peer's notifications
				// keep a grant nobody reads driven no longer.
				since := a.grantAge(now)
				if since < youngGrant {
					since = min(since, now.Sub(event))
				}
				limit = min(limit, max(readPause, since/readLag))
			}
			first := grantPause
			if reading {
				first = firstPause
			}
			wait = min(max(2*wait, first), limit)
			pause.Reset(wait)
			a.parked.Store(true)
			select {
			case <-a.stop:
				pause.Stop()
				return
			case <-a.wake:
				pause.Stop()
				event, wait, kicked = time.Now(), 0, true
			case <-pause.C:
			}
			a.parked.Store(false)
			a.wakeups.Add(1)
		}
	}
}

// Close implements xfer.DataTransport. It waits up to CloseTimeout for the
// READs in flight to end, driving the agent, then releases every request
// and remote agent, deregisters the region and destroys the agent, which
// stops whatever still runs: once Close returns nothing writes into the
// region. It returns ErrMayStillWrite-wrapped news of READs it had to stop
// that way.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	close(a.stop)
	a.mu.Unlock()
	<-a.done

	a.lockC()
	defer a.unlockC()
	// Quiesce: UCX has aborted the process when agents were destroyed with
	// READs between them in flight (UCX 1.13), so let them end first.
	// A touch READ is waited for only briefly (touchCloseWait), and is not
	// counted: it writes only into the touch page, freed after the agent.
	start := time.Now()
	deadline := start.Add(a.cfg.CloseTimeout)
	running := 0
	for {
		running = 0
		for _, r := range a.handles {
			// Queued READs were never posted; a refused one has no request.
			if r.phase == posted && !r.refused && C.cnixl_check(a.c, r.ch) == C.CNIXL_IN_PROG {
				running++
			}
		}
		a.mu.Unlock()
		a.reapZombiesC()
		a.mu.Lock()
		running += len(a.zombies)
		now := time.Now()
		if running == 0 && (len(a.touches) == 0 || now.Sub(start) > min(touchCloseWait, a.cfg.CloseTimeout)) || now.After(deadline) {
			break
		}
		a.mu.Unlock()
		a.pollC()
		a.mu.Lock()
		time.Sleep(20 * time.Microsecond)
	}
	C.cnixl_agent_destroy(a.c)
	a.c = nil
	clear(a.handles)
	clear(a.peers)
	clear(a.byMeta)
	clear(a.claims)
	a.zombies, a.touches, a.inbox, a.queued, a.ended, a.peerOps = nil, nil, nil, nil, nil, nil
	if running > 0 {
		return fmt.Errorf("nixl: close: %d READs still running after %v were stopped by destroying the agent", running, a.cfg.CloseTimeout)
	}
	return nil
}
