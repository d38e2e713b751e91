// Package nixl is a data plane over NVIDIA NIXL, the library vLLM moves
// embeddings with (RDMA between machines; UCX also over TCP and shared
// memory), through cgo. An [Agent] is an xfer.DataTransport: give it to
// connector.NewPool or connector.NewProducer in place of transport.TCPData
// to fetch from vLLM producers or serve vLLM consumers.
//
// Build tags:
//   - nixl: the real thing, over NIXL's C API (libnixl_capi.so), which
//     New loads at run time (cnixl_nixl.c): the build needs no NIXL, and a
//     binary where NIXL is not installed starts; New then returns
//     ErrNotInstalled, wrapped, saying what is missing (see EnvLib). See
//     docs/nixl.md for flags and UCX settings.
//   - nixlfake: the same Go and cgo code over an in-process C fake of the
//     same ABI (cnixl_fake.c), so CI exercises the cgo path: pointer rules,
//     handle lifetimes, error mapping.
//   - neither: the package compiles and New returns ErrNotBuilt.
//
// The agent registers the block region (memory-mapped, never Go heap) as
// DRAM with one transfer descriptor per block, as the reference does. Over
// UCX a READ moves only while both agents are driven: by default a
// goroutine drives the agent while a READ may come (see [Progress]). NIXL
// cannot stop a READ for certain: one released while it runs is reported
// as possibly writing (xfer.ErrMayStillWrite) and released once it ends.
//
// NIXL does not enforce grants: a peer that has a producer's metadata can
// READ any block it registered. Keep NIXL producers on a trusted network;
// the TCP data plane refuses what was not granted.
//
// The example programs run over NIXL with -data nixl (docs/nixl.md). The
// design, and why: docs/design.md in the repository.
package nixl

import (
	"errors"
	"fmt"
	"time"
)

// Config configures an Agent. The zero value of every field but Name
// means its default.
type Config struct {
	Name    string // agent name; required and unique among peers
	Backend string // default "UCX"
	// Params are the backend's parameters, e.g.
	// {"ucx_error_handling_mode": "none"}, which UCX's shared-memory
	// transports need, or {"num_workers": "2"}, the UCX backend's number
	// of workers (NIXL's default when absent).
	Params map[string]string

	// Progress says who drives the agent. Over UCX a READ moves only while
	// both agents are driven: the consumer's and, over TCP, the
	// producer's, which has no call of its own to make while a peer reads
	// its memory. Default ProgressGoroutine.
	Progress Progress
	// ProgressDelay is, for ProgressGoroutine, the longest pause between
	// rounds. After a round that found work the rounds go on for Spin,
	// then pause, on a precise timer, each pause twice the last from 25 µs
	// (200 µs while only a producer's grants are live) up to
	// ProgressDelay; while READs are outstanding (this agent's own, or
	// peers' of its live grants), up to 1 ms until a twentieth of the time
	// since the last post, end or grant's notification is longer (an end,
	// or a peer's READ that needs us driven, is seen at most 1 ms, or 5 %,
	// late). Default 10 ms: an agent whose READ hangs, or a producer with
	// grants live and nothing happening, wakes about 100 times a second
	// once 200 ms have passed without an event. For ProgressThread it is NIXL's
	// pthrDelay: the thread wakes on events and at least this often;
	// default 1 ms. Ignored by ProgressCaller.
	ProgressDelay time.Duration
	// Spin is how long ProgressGoroutine goes on driving the agent round
	// after round, yielding between rounds but never pausing, after a
	// round that found work (a READ posted or ended, a peer's
	// notification of a grant, a progress call that moved bytes); default
	// 50 µs. A peer's notification counts at most once per grant made,
	// never more often than grants are live, and, unless this agent's own
	// READs are outstanding, only while the newest grant is under 100 ms
	// old: a peer cannot keep the goroutine spinning by sending
	// notifications. A READ that ends within it is seen at once; one that
	// ends later is seen within about the time it took, as the pauses
	// double. A longer Spin costs a core
	// for that long after every such event, also while a READ hangs: set
	// it only where a core is to spare. A Spin as long as a READ may take
	// drives READs continuously, a core for as long as any is outstanding.
	Spin time.Duration
	// IdlePoll is how often ProgressGoroutine drives an agent with nothing
	// outstanding or expected; default 50 ms.
	IdlePoll time.Duration
	// CloseTimeout bounds how long Close waits for READs in flight to end
	// before it destroys the agent, which stops them; default 5 s.
	CloseTimeout time.Duration
	// SyncPost makes the step loop's calls call into C themselves,
	// waiting while the progress goroutine is in a call of its own:
	// AddRemotePeer loads the producer's metadata (2-18 ms here on the
	// first ack from a producer), PostRead posts every READ (over UCX
	// shared memory NIXL copies inside the post: about 5 ms for 64 MiB
	// here), and Check asks NIXL. NIXL's errors are then returned by the
	// call that met them.
	//
	// By default (ProgressGoroutine without SyncPost) none of those calls
	// waits for C. The progress goroutine loads and removes remote agents,
	// and posts a READ after its peer's load; PostRead posts a READ in the
	// step only when it moves at most InlinePost bytes, fewer than eight
	// READs are held, and no call into C is under way. A READ NIXL
	// refuses on the goroutine ends Failed, as do those queued behind a
	// load that failed, and PostRead then refuses READs from that peer
	// with xfer.ErrUnknownPeer (the consumer session registers it again).
	// The other Progress modes always call in the step.
	SyncPost bool
	// InlinePost is the largest READ, in bytes, that PostRead posts in the
	// caller's step (when C is free and fewer than eight READs are held);
	// larger ones are handed to the progress goroutine. A hand-off added
	// about 30 µs to the median of a lone fetch of 16 × 8 KiB over UCX
	// shared memory here; a copy within the post takes 18-52 µs per
	// 256 KiB (5-15 GB/s). Over RDMA and TCP the post returns at once.
	// Default 256 KiB; negative: every READ is handed off.
	InlinePost int
}

// Progress says who drives a NIXL agent.
type Progress int

const (
	// ProgressGoroutine (the default) drives the agent from a goroutine
	// of its own while this agent has READs outstanding or a producer has
	// grants live: round after round for Spin after
	// each event, then with pauses that double up to ProgressDelay (see
	// there); every IdlePoll otherwise. A READ that never ends costs
	// about a hundred wake-ups a second, not a core.
	ProgressGoroutine Progress = iota
	// ProgressThread starts NIXL's own progress thread, which waits for
	// UCX events with ProgressDelay as its timeout. (NIXL's own default,
	// a delay of 0, spins a core for good; it is not offered.)
	ProgressThread
	// ProgressCaller leaves driving to the caller: only Check and
	// DrainNotifs progress the agent. A producer then moves READs only as
	// often as it drains notifications.
	ProgressCaller
)

func (p Progress) String() string {
	switch p {
	case ProgressGoroutine:
		return "goroutine"
	case ProgressThread:
		return "thread"
	case ProgressCaller:
		return "caller"
	}
	return fmt.Sprintf("Progress(%d)", int(p))
}

// ErrNotBuilt is returned by New when ecxfer was built without the nixl
// build tag.
var ErrNotBuilt = errors.New("nixl: ecxfer was built without NIXL: build with -tags nixl " +
	`(no NIXL headers needed; CGO_LDFLAGS="-Wl,-rpath,$NIXL/lib", NIXL's lib folder, lets the binary find NIXL ` +
	"without LD_LIBRARY_PATH); see docs/nixl.md")

// ErrNotInstalled is returned by New, wrapped, in a build with the nixl
// tag when NIXL's C API (libnixl_capi.so) cannot be loaded: the error
// says what the loader said and what to set. Nothing else needs NIXL, so
// the TCP data plane works all the same.
var ErrNotInstalled = errors.New("nixl: NIXL not found")

// EnvLib is the environment variable naming NIXL's C API library
// (libnixl_capi.so, or the folder holding it) for a build with the nixl
// tag. Unset, the dynamic loader searches LD_LIBRARY_PATH, the binary's
// rpath and its cache; set, only that file is tried. It is read when the
// first agent is made; once NIXL is loaded it stays.
const EnvLib = "ECXFER_NIXL_LIB"
