// Package plane is the plumbing between a producer session and a data
// plane that serves READs itself (the TCP data plane): the gate the
// session lends the plane while it is attached, and what the plane offers
// back (a board of live grants for consumers on its host, pushes, a hook
// where notifications arrive). Engines never see it.
//
// A producer session attaches when it starts and detaches when it closes.
// Everything it installed goes with its attachment: after Detach the plane
// serves no READ through its gate, shows none of its grants, pushes none,
// and calls none of its hooks, so a session that replaces it starts clean.
// Until then it stays live beside a successor: what its grants bring is
// its own (see Attacher).
package plane

import (
	"context"
	"time"

	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Gate is the producer session's side: it decides which READs are served.
type Gate interface {
	// Authorize checks a READ asked for by agent (a label for logs) under
	// the grant notif names, presenting the grant's token, of the producer
	// blocks blocks. If it grants, the blocks stay the entry's until
	// Hold.Release, which the plane calls once the bytes are out of the
	// region. It is called on the plane's goroutines, concurrently.
	Authorize(agent string, notif []byte, blocks []int) (Hold, bool)
}

// Hold is a granted READ's hold on its entry.
type Hold struct {
	Release func()
	// Consumer names the consumer session the grant was made for: a
	// connection that presented one of its grants' tokens is that
	// session's, and takes pushes of its grants.
	Consumer uint64
	// Left is at most how long the grant has left (its lease will do):
	// the plane stops serving the READ, and releases the hold, once Left
	// and a short grace have passed since Authorize, however slowly the
	// consumer takes the bytes. Zero: no bound but the plane's own.
	Left time.Duration
}

// Attacher is implemented by data planes a producer session attaches to.
// Several attachments may be live at once on one plane (a session draining
// while its successor grants): the newest is asked first and alone shows
// grants on the board, and every READ, its notification, its broken-READ
// report and every push belong to the attachment whose gate authorized
// the grant, until that one's Detach. A plane may bound how many are live
// (the TCP plane: 4, detaching the oldest at the bound).
type Attacher interface {
	Attach(g Gate) Attachment
}

// Attachment is a producer session's hold on a data plane. Its methods
// must not block; after Detach they do nothing.
type Attachment interface {
	// Publish shows a live grant to consumers on this host, so that they
	// copy its blocks without asking (before its ack leaves); Retire
	// takes it down (before its pin goes). A grant never published, or
	// one whose slot another holds, is asked for per READ.
	Publish(grant uint64)
	Retire(grant uint64)
	// Push sends a grant's blocks to a connection of its consumer session
	// that takes pushes, with notif, the notification its READ will carry.
	// It returns false when it does not push, and the hold is the
	// caller's to end; else it calls release exactly once, when the bytes
	// are out of the region.
	Push(consumer uint64, notif []byte, blocks []int, release func()) bool
	// OnNotify installs f, which a plane goroutine runs after it queued
	// completion notifications, so that the producer takes them where
	// they arrive; f reports whether it did (else the plane signals its
	// loop). nil removes it.
	OnNotify(f func() bool)
	// Broken appends to dst, and forgets, the notifications of READs the
	// plane served through this attachment's gate that cannot complete:
	// their connection closed before the consumer confirmed that every
	// byte landed. Every byte had left the region (or never will) by
	// then: the session may end their grants at once instead of at the
	// lease. The hook is run when some are queued. The list is bounded
	// per attachment (the TCP plane: 65536); past it a grant ends at its
	// lease, and the plane counts it.
	Broken(dst []xfer.Notif) []xfer.Notif
	// Detach ends the attachment: the board is cleared, connections
	// forget the consumers they served, the hook is removed.
	Detach()
}

// Drainer is an Attachment that keeps the completion notifications of its
// own grants' READs: its session takes them here instead of from the data
// plane's DrainNotifs, which hands out those of every session attached.
type Drainer interface {
	DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error)
}

// Leased is a Gate whose grants hold their entries for at most Lease
// from when they are made: the plane stops writing a push of one, and
// ends its hold, once the lease and the grace of a READ's answer
// (Hold.Left) have passed since Push, however slowly the consumer reads.
type Leased interface {
	Lease() time.Duration
}

// Contacter is a data plane that can make contact with a producer it has
// registered ahead of the first READ, so that the first fetch pays for no
// set-up: the TCP plane's connections, their hello and welcome (with the
// same-host proof, and the mapped region's pages faulted in), NIXL's
// loading of the producer's metadata and its connection.
type Contacter interface {
	// Contact makes the contact with the registered producer agent and
	// waits until it is made, it failed, or ctx ended.
	Contact(ctx context.Context, agent string, c Contact) error
}

// Contact is what a Go producer's contact answer gave the consumer's data
// plane for its contact.
type Contact struct {
	// Notif, if set, is the notification of the grant of no blocks the
	// producer made with its contact answer: a READ of nothing under it
	// ends it, and on a plane that takes pushes proves the connection it
	// went on to be the consumer session's.
	Notif []byte
	// Touch, when its Count is set, is the producer's touch page
	// (wire.XferAck.Touch): a plane whose first READ of a producer does
	// set-up (NIXL's, over UCX) reads it once, so that the first fetch
	// does not pay for that. A plane checks it as untrusted: the
	// producer sent it.
	Touch wire.Blocks
}

// Toucher is a data plane that has a touch page: a few bytes of its own
// registered memory, apart from the region, that any peer may READ. A
// producer names it in its contact answers (wire.XferAck.Touch).
type Toucher interface {
	TouchPage() wire.Blocks
}

// Driven is a data plane that moves a peer's READ of local memory only
// while the local side is driven (NIXL over UCX without NIXL's progress
// thread). A producer reports its live grants after every step, and
// whether the step made one or took a contact request (fresh: a READ, or
// a consumer's connection set-up, may come soon, though the count did not
// rise), so the data plane can drive itself while a READ may come and rest
// otherwise. ExpectReads must not block.
type Driven interface {
	ExpectReads(grants int, fresh bool)
}

// ShapedPeers is a data plane that can register a producer from the shape
// of its region, back-to-back blocks of one size, instead of its per-block
// descriptor, which costs an ack 14 bytes a block. A consumer session
// whose data plane has it offers to take shapes (wire.XferReq.AcceptsShape),
// and a Go producer whose own descriptor is one then sends the shape
// (wire.XferAck.Shape). AddRemotePeerShape is AddRemotePeer of the
// descriptor wire.AppendBlockDescs writes for shape.
type ShapedPeers interface {
	AddRemotePeerShape(metadata []byte, shape wire.Blocks) (xfer.Peer, error)
}

// Signaling is a data plane that tells when there is work: Ready's
// channel receives when notifications wait for DrainNotifs, or a READ
// posted here ended, since the last receive. A step loop then sleeps until
// the event instead of polling on a tick. A nil channel means the plane
// does not signal, as configured: loops poll it.
type Signaling interface {
	Ready() <-chan struct{}
}

// ConsumerSignaling is a Signaling data plane that gives a consumer a
// channel of its own: ConsumerReady's receives on the same events as
// Ready's, so that a Pool and a Producer on one plane each have one and
// neither takes the other's wake-up (either may be the loop that steps
// both, so each hears every event).
type ConsumerSignaling interface {
	ConsumerReady() <-chan struct{}
}

// SignalHooked is a ConsumerSignaling data plane that also calls a
// function wherever it sends on ConsumerReady's channel, so that a loop
// that waits on something else than that channel hears it (OwnWaiter).
// f must not block; remove stops the calls. Pushes says whether a
// READ's bytes may come pushed behind its ack, landed by a goroutine of
// the plane's: a loop that read the ack itself would post the READ before
// its push came, and the producer would answer it as well.
type SignalHooked interface {
	OnSignal(f func()) (remove func())
	Pushes() bool
}

// OwnWaiter is a control plane whose waiting loop can read its one busy
// connection itself (*transport.Client): WaitOwn is a wait of at most d
// (negative: no limit) that checks ready only as it starts, so a loop
// uses it only where ready is nil or its plane's signal calls Interrupt
// (SignalHooked). ok false: it did not wait, and the loop waits as usual.
type OwnWaiter interface {
	WaitOwn(ctx context.Context, ready <-chan struct{}, d time.Duration) (woke, ok bool)
	Interrupt()
}

// Waiter is a data plane that reads some of its sockets in its loop's
// steps (DrainNotifs, Stepped's Step), and must know when the loop waits
// instead: Waiting is called before the loop blocks, and the function it
// returns when it stops waiting.
type Waiter interface {
	Waiting() (done func())
}

// Stepped is a data plane whose consumer side reads some of its sockets
// in the step of the loop that owns it, while the loop steps: Step reads
// what they have, without waiting, and lands what came whole. A loop that
// calls Step must tell its Waiter when it waits instead.
type Stepped interface {
	Step()
}

// Serving is a Waiter for a producer whose loop is a goroutine of its own
// (Serve: its steps run where messages arrive): Serving hands the sockets
// the producer's steps read to their goroutines for its whole run, and
// leaves those of a consumer that steps on the same plane to that
// consumer's steps. Waiting, for a loop that may step either side, hands
// back all of them.
//
// ServeReady is Ready for Serve: it receives on a producer's events alone
// (notifications), not on the end of a READ a consumer on the same plane
// posted, which Serve has nothing to do for.
type Serving interface {
	Serving() (done func())
	ServeReady() <-chan struct{}
}

// Named is a data plane whose agent has a name its peers see on
// notifications. A consumer sends it with its requests, so that a Go
// producer lets only this agent read and complete its grants.
type Named interface {
	Name() string
}

// Stoppable is a data plane whose Release stops a READ in progress for
// certain (the TCP plane closes its connection and waits for the bytes to
// stop landing): a canceled READ's blocks are free at once. Elsewhere
// (NIXL) a canceled READ is followed until it ends.
type Stoppable interface {
	StopsReads() bool
}

// Explainer is a data plane that says why a READ failed: asked once Check
// said Failed, and before the handle's Release, FailedWhy returns the
// error that ended it, or nil where it does not know.
type Explainer interface {
	FailedWhy(h xfer.Handle) error
}

// adapters are the data planes' packages' ways to the interfaces of this
// package, each registered in its package's init: the planes' own types
// keep no method for them in their public API.
var adapters []func(data any) any

// Register adds a way to a data plane's side of this package: f returns,
// for a data plane of its package, a value that implements those of the
// interfaces here that the plane offers, else nil. For init functions only.
func Register(f func(data any) any) { adapters = append(adapters, f) }

// As returns data's T: data itself when it implements T (test fakes do),
// else the registered adapter of its package when that does.
func As[T any](data any) (T, bool) {
	if t, ok := data.(T); ok {
		return t, true
	}
	for _, f := range adapters {
		if a := f(data); a != nil {
			t, ok := a.(T)
			return t, ok
		}
	}
	var zero T
	return zero, false
}

// ContacterOf returns data's Contacter, or nil when it has none.
func ContacterOf(data any) Contacter {
	c, _ := As[Contacter](data)
	return c
}

// TouchPageOf returns data's touch page (Toucher), or none.
func TouchPageOf(data any) wire.Blocks {
	if t, ok := As[Toucher](data); ok {
		return t.TouchPage()
	}
	return wire.Blocks{}
}

// AttacherOf returns data's Attacher, or nil when it has none.
func AttacherOf(data any) Attacher {
	a, _ := As[Attacher](data)
	return a
}
