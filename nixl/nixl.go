// Package nixl is a data plane over NVIDIA NIXL, the library vLLM moves
// embeddings with (RDMA between machines; UCX also over TCP and shared
// memory), through cgo. An [Agent] is an xfer.DataTransport: give it to
// connector.NewPool or connector.NewProducer in place of
// transport.TCPData to fetch from vLLM producers or serve vLLM consumers.
//
// Build with -tags nixl for the real NIXL: [New] loads its C API
// (libnixl_capi.so, see [EnvLib]) at run time, so the build needs no NIXL,
// and New returns [ErrNotInstalled], wrapped, where it is missing. With
// -tags nixlfake the same code runs over an in-process C fake (for CI);
// with neither tag New returns [ErrNotBuilt].
//
// Over UCX a READ moves only while both agents are driven: by default a
// goroutine of the agent's does it (see [Progress]). A READ released while
// it runs is reported as possibly writing (xfer.ErrMayStillWrite).
//
// NIXL does not enforce grants: a peer that has a producer's metadata can
// READ any block it registered. Keep NIXL producers on a trusted network.
// Building, running, UCX settings and errors: docs/nixl.md in the
// repository.
package nixl

import (
	"errors"
	"fmt"
	"time"
)

// Config configures an Agent. Zero fields but Name take defaults.
type Config struct {
	Name    string // agent name; required and unique among peers
	Backend string // default "UCX"
	// Params are the backend's parameters, e.g. {"ucx_error_handling_mode":
	// "none"}, which UCX's shared-memory transports need (docs/nixl.md).
	Params   map[string]string
	Progress Progress // who drives the agent; default ProgressGoroutine
	// ProgressDelay is ProgressGoroutine's longest pause between rounds
	// (default 10 ms), or ProgressThread's wake-up period (default 1 ms).
	ProgressDelay time.Duration
	// Spin is how long ProgressGoroutine drives the agent without pausing
	// after an event; default 50 µs. A longer Spin costs a core that long.
	Spin         time.Duration
	IdlePoll     time.Duration // ProgressGoroutine's poll with nothing outstanding; default 50 ms
	CloseTimeout time.Duration // how long Close lets READs in flight end; default 5 s
	// SyncPost makes AddRemotePeer, PostRead and Check call into NIXL in
	// the caller's step, returning NIXL's errors, as the other Progress
	// modes always do; by default the progress goroutine does the slow calls.
	SyncPost bool
	// InlinePost is the largest READ, in bytes, PostRead posts itself when
	// NIXL is free; default 256 KiB, negative: the goroutine posts every READ.
	InlinePost int
}

// Progress says who drives a NIXL agent.
type Progress int

const (
	// ProgressGoroutine, the default, drives the agent from a goroutine
	// while READs or a producer's grants are live; a READ that never ends
	// costs about a hundred wake-ups a second, not a core.
	ProgressGoroutine Progress = iota
	// ProgressThread starts NIXL's own progress thread, woken by UCX
	// events or every ProgressDelay.
	ProgressThread
	// ProgressCaller leaves driving to Check and DrainNotifs: a producer
	// then moves READs only as often as it drains notifications.
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

// ErrNotBuilt is returned by New in a build without the nixl tag.
var ErrNotBuilt = errors.New("nixl: ecxfer was built without NIXL: build with -tags nixl " +
	`(no NIXL headers needed; CGO_LDFLAGS="-Wl,-rpath,$NIXL/lib", NIXL's lib folder, lets the binary find NIXL ` +
	"without LD_LIBRARY_PATH); see docs/nixl.md")

// ErrNotInstalled is returned by New, wrapped, in a build with the nixl
// tag when NIXL's C API cannot be loaded; the error says what to set.
var ErrNotInstalled = errors.New("nixl: NIXL not found")

// EnvLib names the variable giving NIXL's C API library (libnixl_capi.so
// or its folder); set, only that is tried, else the dynamic loader
// searches as usual. It is read when the first agent is made.
const EnvLib = "ECXFER_NIXL_LIB"
