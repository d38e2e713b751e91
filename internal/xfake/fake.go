// Package xfake provides a scriptable, in-memory xfer.DataTransport for
// this module's tests (xfertest.FakePair is its public, unscripted face).
// Fakes on one Fabric reach each other: a READ copies the producer's bytes
// into the consumer's blocks and delivers its notification to the
// producer, exactly once, when it completes.
package xfake

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Kind says how a READ ends.
type Kind uint8

const (
	// CompleteAfter: Check reports InProgress After times, then Complete.
	CompleteAfter Kind = iota
	// FailAfter: Check reports InProgress After times, then Failed.
	FailAfter
	// Stuck: InProgress until Finish or FailRead is called.
	Stuck
	// CheckError: Check reports InProgress After times, then returns an
	// error on every later call; the READ completes when Finish is called.
	CheckError
)

// Outcome scripts one READ.
type Outcome struct {
	Kind  Kind
	After int // checks that see InProgress first
	// Unstoppable makes Release of this READ while in progress fail with
	// xfer.ErrMayStillWrite; it keeps "writing" until Finish or FailRead.
	Unstoppable bool
	// TargetDrains makes the READ move only while the producer is driven,
	// as NIXL over UCX TCP does: it stays InProgress until the producer's
	// DrainNotifs has been called this many times since the post.
	TargetDrains int
	// NotifDelay holds the completion notification back for this many of
	// the producer's DrainNotifs calls: notifications arrive late, and
	// out of order with later READs'.
	NotifDelay int
}

// ErrInjected is what scripted failures return unless told otherwise.
var ErrInjected = errors.New("xfake: injected failure")

// Post records one PostRead call that succeeded.
type Post struct {
	Handle xfer.Handle
	Local  []int
	Agent  string
	Remote []int
	Notif  string
}

// Fabric connects fakes: each is reachable by its agent name.
type Fabric struct {
	state  sync.Mutex // guards every fake's state: a READ touches two fakes
	mu     sync.Mutex // guards agents and gens
	agents map[string]*Fake
	gens   map[string]int // agents made per name
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric { return &Fabric{agents: map[string]*Fake{}, gens: map[string]int{}} }

// New returns a fake agent on a fabric of its own.
func New(name string, blocks, blockSize int) *Fake { return NewFabric().New(name, blocks, blockSize) }

// New returns a fake agent named name with a region of blocks blocks of
// blockSize bytes, reachable from the fabric's other agents. Another agent
// of the same name (a restarted producer, or a replica configured with one
// name) is a different peer with its own metadata: READs registered from
// its metadata reach it, and fail once it is closed (a crash).
func (fab *Fabric) New(name string, blocks, blockSize int) *Fake {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	gen := fab.gens[name]
	fab.gens[name]++
	f := &Fake{
		mu: &fab.state, fab: fab, name: name, gen: gen, blocks: blocks, blockSize: blockSize,
		mem:      make([]byte, blocks*blockSize),
		peers:    map[string]int{},
		xfers:    map[xfer.Handle]*read{},
		releases: map[xfer.Handle]int{},
		serving:  map[*read]struct{}{},
	}
	f.meta = []byte(fmt.Sprintf("fake:%s:%d:%d", name, gen, blocks))
	f.desc = wire.AppendBlockDescs(nil, fakeBase, uint64(blockSize), blocks, 0)
	fab.agents[peerKey(name, gen)] = f
	return f
}

// fakeBase is where every fake's region claims to start.
const fakeBase = 0x10000

// peerKey is the agent a consumer addresses: the name, and from the second
// agent of a name on, its generation.
func peerKey(name string, gen int) string {
	if gen == 0 {
		return name
	}
	return name + "#" + strconv.Itoa(gen)
}

func (fab *Fabric) lookup(name string) *Fake {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	return fab.agents[name]
}

type read struct {
	release  func() // the producer's authorization hold, while served
	refused  bool   // the producer's authorizer refused it
	why      error  // why it failed (FailedWhy)
	post     Post
	out      Outcome
	checks   int
	progress xfer.Progress
	target   *Fake
	drains   int // the target's drains when posted
}

// Fake is a scriptable xfer.DataTransport. Its zero value is not usable; see
// New and Fabric.New.
type Fake struct {
	fab       *Fabric
	name      string
	gen       int
	blocks    int
	blockSize int
	meta      []byte
	desc      []byte

	mu         *sync.Mutex // the fabric's state lock
	mem        []byte
	peers      map[string]int // agent -> registrations held
	xfers      map[xfer.Handle]*read
	stops      bool // StopsReads
	late       []lateNotif
	auth       func(agent string, notif []byte, blocks []int) (func(), bool)
	serving    map[*read]struct{} // READs of this fake's memory it authorized
	releases   map[xfer.Handle]int
	zombies    []*read // released while unstoppable, not ended yet
	next       xfer.Handle
	posts      []Post
	notifs     []xfer.Notif
	outcome    Outcome
	outcomeFn  func(Post) Outcome
	queue      []Outcome
	addPeerErr error
	postErr    error
	drainErr   error
	drains     int // DrainNotifs calls
	notifies   int // Notify calls that sent
	closed     bool
}

var (
	_ xfer.DataTransport = (*Fake)(nil)
	_ plane.ShapedPeers  = (*Fake)(nil)
	_ plane.Named        = (*Fake)(nil)
	_ plane.Stoppable    = (*Fake)(nil)
	_ plane.Notifier     = (*Fake)(nil)
)

// Name returns the agent name.
func (f *Fake) Name() string { return f.name }

// Blocks returns the number of blocks of the fake's region.
func (f *Fake) Blocks() int { return f.blocks }

// Block returns block i of the fake's region, for filling and verifying.
func (f *Fake) Block(i int) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mem[i*f.blockSize : (i+1)*f.blockSize]
}

// SetOutcome sets how READs posted from now on end, after the queued ones.
func (f *Fake) SetOutcome(o Outcome) { f.mu.Lock(); f.outcome = o; f.mu.Unlock() }

// SetOutcomeFunc makes fn decide how each READ posted from now on ends,
// after the queued ones; nil goes back to SetOutcome's. A simulation draws
// outcomes from its own seeded generator this way.
func (f *Fake) SetOutcomeFunc(fn func(Post) Outcome) { f.mu.Lock(); f.outcomeFn = fn; f.mu.Unlock() }

// QueueOutcomes scripts the next READs, one outcome each, in order.
func (f *Fake) QueueOutcomes(os ...Outcome) {
	f.mu.Lock()
	f.queue = append(f.queue, os...)
	f.mu.Unlock()
}

// SetAddPeerError makes AddRemotePeer fail with err (nil: succeed).
func (f *Fake) SetAddPeerError(err error) { f.mu.Lock(); f.addPeerErr = err; f.mu.Unlock() }

// SetPostError makes PostRead fail with err (nil: succeed).
func (f *Fake) SetPostError(err error) { f.mu.Lock(); f.postErr = err; f.mu.Unlock() }

// SetDrainError makes DrainNotifs fail with err (nil: succeed).
func (f *Fake) SetDrainError(err error) { f.mu.Lock(); f.drainErr = err; f.mu.Unlock() }

// InjectNotif queues a notification as if agent had sent it.
func (f *Fake) InjectNotif(agent string, msg []byte) {
	f.mu.Lock()
	f.notifs = append(f.notifs, xfer.Notif{Agent: agent, Msg: bytes.Clone(msg)})
	f.mu.Unlock()
}

// Notify implements plane.Notifier: notif reaches the agent as a READ's
// would, with no READ. Notifies counts them.
func (f *Fake) Notify(agent string, notif []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		return xfer.ErrClosed
	case f.peers[agent] == 0:
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	f.notifies++
	if t := f.fab.lookup(agent); t != nil && t != f && !t.closed {
		t.notifs = append(t.notifs, xfer.Notif{Agent: f.name, Msg: bytes.Clone(notif)})
	}
	return nil
}

// Notifies returns how many notifications Notify sent.
func (f *Fake) Notifies() int { f.mu.Lock(); defer f.mu.Unlock(); return f.notifies }

// Posts returns the READs posted so far.
func (f *Fake) Posts() []Post {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.posts)
}

// Releases returns how many times h was released.
func (f *Fake) Releases(h xfer.Handle) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.releases[h]
}

// AgentMetadata implements xfer.DataTransport.
func (f *Fake) AgentMetadata() []byte { return f.meta }

// MemDescriptor implements xfer.DataTransport.
func (f *Fake) MemDescriptor() []byte { return f.desc }

// AddRemotePeer implements xfer.DataTransport. The metadata names an agent on
// the same fabric; the descriptor is not read.
func (f *Fake) AddRemotePeer(metadata, _ []byte) (xfer.Peer, error) { return f.addPeer(metadata, nil) }

// AddRemotePeerShape implements plane.ShapedPeers: AddRemotePeer, refusing
// a shape that is not the agent's region's as MemDescriptor gives it (its
// block size unchecked for an agent on another fabric).
func (f *Fake) AddRemotePeerShape(metadata []byte, shape wire.Blocks) (xfer.Peer, error) {
	return f.addPeer(metadata, &shape)
}

// addPeer registers the agent metadata names, if shape (when there is one)
// is its region's.
func (f *Fake) addPeer(metadata []byte, shape *wire.Blocks) (xfer.Peer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return xfer.Peer{}, xfer.ErrClosed
	}
	if f.addPeerErr != nil {
		return xfer.Peer{}, f.addPeerErr
	}
	parts := strings.Split(string(metadata), ":")
	if len(parts) != 4 || parts[0] != "fake" {
		return xfer.Peer{}, fmt.Errorf("xfertest: bad metadata %q", metadata)
	}
	n, err := strconv.Atoi(parts[3])
	gen, err2 := strconv.Atoi(parts[2])
	if err != nil || err2 != nil {
		return xfer.Peer{}, fmt.Errorf("xfertest: bad metadata %q", metadata)
	}
	key := peerKey(parts[1], gen)
	if shape != nil {
		want := wire.Blocks{Base: fakeBase, Size: shape.Size, Count: n}
		if t := f.fab.lookup(key); t != nil {
			want.Size = uint64(t.blockSize)
		}
		if *shape != want {
			return xfer.Peer{}, fmt.Errorf("xfertest: shape %+v is not %s's region", *shape, key)
		}
	}
	f.peers[key]++
	return xfer.Peer{Agent: key, Blocks: n}, nil
}

// RemoveRemotePeer implements xfer.DataTransport.
func (f *Fake) RemoveRemotePeer(agent string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peers[agent] == 0 {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	if f.peers[agent]--; f.peers[agent] == 0 {
		delete(f.peers, agent)
	}
	return nil
}

// PostRead implements xfer.DataTransport.
func (f *Fake) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		return 0, xfer.ErrClosed
	case f.postErr != nil:
		return 0, f.postErr
	case len(local) != len(remote):
		return 0, xfer.ErrLengthMismatch
	case f.peers[agent] == 0:
		return 0, fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	for _, b := range local {
		if b < 0 || b >= f.blocks {
			return 0, fmt.Errorf("xfertest: local block %d outside %d", b, f.blocks)
		}
	}
	f.next++
	p := Post{Handle: f.next, Local: slices.Clone(local), Agent: agent, Remote: slices.Clone(remote), Notif: string(notif)}
	out := f.outcome
	switch {
	case len(f.queue) > 0:
		out, f.queue = f.queue[0], f.queue[1:]
	case f.outcomeFn != nil:
		out = f.outcomeFn(p)
	}
	f.posts = append(f.posts, p)
	r := &read{post: p, out: out, target: f.fab.lookup(agent)}
	if t := r.target; t != nil {
		r.drains = t.drains
		if t.auth != nil && !t.closed {
			// Served from now to its end, as the TCP plane serves it:
			// the producer's grant check, and its hold on the blocks.
			if rel, ok := t.auth(f.name, notif, remote); ok {
				r.release = rel
				t.serving[r] = struct{}{}
			} else {
				r.refused = true
			}
		}
	}
	f.xfers[p.Handle] = r
	return p.Handle, nil
}

// Check implements xfer.DataTransport.
func (f *Fake) Check(h xfer.Handle) (xfer.Progress, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.xfers[h]
	if !ok {
		return 0, fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	if r.progress != xfer.InProgress {
		return r.progress, nil
	}
	if r.refused {
		f.endLocked(r, xfer.Failed)
		return r.progress, nil
	}
	if t := r.target; r.out.TargetDrains > 0 && t != nil && t.drains-r.drains < r.out.TargetDrains {
		return xfer.InProgress, nil // not driven: nothing moves
	}
	r.checks++
	if r.checks <= r.out.After || r.out.Kind == Stuck {
		return xfer.InProgress, nil
	}
	switch r.out.Kind {
	case CompleteAfter:
		f.endLocked(r, xfer.Complete)
	case FailAfter:
		f.endLocked(r, xfer.Failed)
	case CheckError:
		return 0, fmt.Errorf("%w: state of %d", ErrInjected, h)
	}
	return r.progress, nil
}

// FailedWhy says why a READ Check said Failed (plane.Explainer).
func (f *Fake) FailedWhy(h xfer.Handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.xfers[h]
	if !ok || r.progress != xfer.Failed {
		return nil
	}
	return r.why
}

// Why the fake fails READs, beside ErrInjected (a scripted failure).
var (
	errRefused      = errors.New("xfake: the producer refused the READ")
	errProducerGone = errors.New("xfake: the producer is closed")
)

// endLocked ends a READ: on success the bytes are copied and the
// notification delivered to the producer.
func (f *Fake) endLocked(r *read, p xfer.Progress) {
	r.progress = p
	defer r.unserve()
	if p != xfer.Complete {
		r.why = fmt.Errorf("%w: READ %d failed", ErrInjected, r.post.Handle)
		if r.refused {
			r.why = errRefused
		}
		return
	}
	if t := r.target; t != nil && t != f {
		if t.closed { // the producer is gone: nothing to read
			r.progress, r.why = xfer.Failed, errProducerGone
			return
		}
		for i, rb := range r.post.Remote {
			if rb >= 0 && rb < t.blocks && t.blockSize == f.blockSize {
				copy(f.mem[r.post.Local[i]*f.blockSize:], t.mem[rb*t.blockSize:(rb+1)*t.blockSize])
			}
		}
		n := xfer.Notif{Agent: f.name, Msg: []byte(r.post.Notif)}
		if r.out.NotifDelay > 0 {
			t.late = append(t.late, lateNotif{n, r.out.NotifDelay})
		} else {
			t.notifs = append(t.notifs, n)
		}
	}
}

// unserve ends the producer's hold on a READ's blocks, once.
func (r *read) unserve() {
	if r.release != nil {
		r.release()
		r.release = nil
		delete(r.target.serving, r)
	}
}

// SetAuthorizer makes the fake gate the READs of its memory as the TCP
// plane does (connector.NewProducer installs the session's check): a READ
// is authorized when posted, fails if refused, and holds the
// authorization until it ends or is stopped.
func (f *Fake) SetAuthorizer(a func(agent string, notif []byte, blocks []int) (release func(), ok bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.auth = a
}

// Authorizer returns the gate SetAuthorizer installed, or nil.
func (f *Fake) Authorizer() func(agent string, notif []byte, blocks []int) (release func(), ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.auth
}

// Serving returns the READs of this fake's memory that its authorizer
// granted and that have not ended: the producer must keep their blocks.
func (f *Fake) Serving() []Post {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Post, 0, len(f.serving))
	for r := range f.serving {
		out = append(out, r.post)
	}
	slices.SortFunc(out, func(a, b Post) int { return strings.Compare(a.Notif, b.Notif) })
	return out
}

// Finish completes a READ still in progress (a Stuck or CheckError one, or
// one released while unstoppable).
func (f *Fake) Finish(h xfer.Handle) { f.end(h, xfer.Complete) }

// FailRead fails a READ still in progress.
func (f *Fake) FailRead(h xfer.Handle) { f.end(h, xfer.Failed) }

func (f *Fake) end(h xfer.Handle, p xfer.Progress) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.xfers[h]; ok && r.progress == xfer.InProgress {
		f.endLocked(r, p)
		r.out.Kind = CompleteAfter // Check reports the end from now on
		return
	}
	for i, r := range f.zombies {
		if r.post.Handle == h {
			f.endLocked(r, p)
			f.zombies = slices.Delete(f.zombies, i, i+1)
			return
		}
	}
}

// SetStopsReads makes the fake claim, through plane.Stoppable, that Release
// stops every READ for certain (as the TCP plane does). Do not combine it
// with Unstoppable outcomes.
func (f *Fake) SetStopsReads(v bool) { f.mu.Lock(); f.stops = v; f.mu.Unlock() }

// StopsReads implements plane.Stoppable.
func (f *Fake) StopsReads() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.stops }

// Release implements xfer.DataTransport.
func (f *Fake) Release(h xfer.Handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.xfers[h]
	if !ok {
		return fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	f.releases[h]++
	delete(f.xfers, h)
	if r.progress == xfer.InProgress && r.out.Unstoppable {
		f.zombies = append(f.zombies, r)
		return xfer.ErrMayStillWrite
	}
	r.unserve() // stopped: nothing more is read
	return nil
}

// DrainNotifs implements xfer.DataTransport.
func (f *Fake) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drains++
	if f.drainErr != nil {
		return dst, f.drainErr
	}
	dst = append(dst, f.notifs...)
	f.notifs = f.notifs[:0]
	kept := f.late[:0]
	for _, l := range f.late {
		if l.drains--; l.drains <= 0 {
			dst = append(dst, l.n)
		} else {
			kept = append(kept, l)
		}
	}
	clear(f.late[len(kept):])
	f.late = kept
	return dst, nil
}

type lateNotif struct {
	n      xfer.Notif
	drains int
}

// Close implements xfer.DataTransport: it releases every handle and peer.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, r := range f.xfers {
		r.unserve()
	}
	for _, r := range f.zombies {
		r.unserve()
	}
	clear(f.xfers)
	clear(f.peers)
	return nil
}

// MayWrite reports whether some READ that has not ended, released or not,
// targets local block b.
func (f *Fake) MayWrite(b int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.xfers {
		if r.progress == xfer.InProgress && slices.Contains(r.post.Local, b) {
			return true
		}
	}
	for _, r := range f.zombies {
		if slices.Contains(r.post.Local, b) {
			return true
		}
	}
	return false
}

// Leaks lists what is still held: handles not released and peers not removed.
type Leaks struct {
	Handles []xfer.Handle
	Peers   []string
}

// Leaks returns what is held now.
func (f *Fake) Leaks() Leaks {
	f.mu.Lock()
	defer f.mu.Unlock()
	var l Leaks
	for h := range f.xfers {
		l.Handles = append(l.Handles, h)
	}
	slices.Sort(l.Handles)
	for p := range f.peers {
		l.Peers = append(l.Peers, p)
	}
	slices.Sort(l.Peers)
	return l
}

// TB is the part of testing.TB that CheckNoLeaks uses.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
}

// CheckNoLeaks fails t if any handle or peer registration is still held.
func (f *Fake) CheckNoLeaks(t TB) {
	t.Helper()
	if l := f.Leaks(); len(l.Handles) > 0 || len(l.Peers) > 0 {
		t.Errorf("xfertest %s: leaked handles %v, peers %v", f.name, l.Handles, l.Peers)
	}
}
