// Package nixl is a data plane over NVIDIA NIXL, the library vLLM moves
// embeddings with (RDMA between machines; UCX also over TCP and shared
// memory). An [Agent] is an xfer.DataTransport: give it to connector.NewPool
// or connector.NewProducer in place of transport.TCPData to fetch from vLLM
// producers or serve vLLM consumers.
//
// Build with -tags nixl: [New] loads NIXL at run time ([EnvLib]), or fails
// with [ErrNotInstalled]; -tags nixlfake runs over a C fake; with neither,
// New fails with [ErrNotBuilt]. NIXL does not enforce grants, so keep NIXL
// producers on a trusted network. Settings and errors: docs/nixl.md.
package nixl

import (
	"errors"
	"fmt"
	"time"
)

// Config configures an Agent. Zero fields but Name take defaults.
type Config struct {
	Name, Backend string            // agent name, required and unique among peers; backend, default "UCX"
	Params        map[string]string // the backend's; UCX's shared memory needs ucx_error_handling_mode=none (docs/nixl.md)
	Progress      Progress          // who drives the agent; default ProgressGoroutine
	ProgressDelay time.Duration     // ProgressGoroutine's longest pause (10 ms), ProgressThread's wake-up period (1 ms)
	Spin          time.Duration     // how long ProgressGoroutine drives on after an event, costing a core; default 50 µs
	IdlePoll      time.Duration     // ProgressGoroutine's poll with nothing outstanding; default 50 ms
	CloseTimeout  time.Duration     // how long Close lets READs in flight end; default 5 s
	SyncPost      bool              // AddRemotePeer, PostRead and Check call NIXL in the caller's step, returning its errors
	InlinePost    int               // largest READ (bytes) PostRead posts itself, not the goroutine; default 256 KiB, negative: none
}

// Progress says who drives a NIXL agent.
type Progress int

const (
	ProgressGoroutine Progress = iota // a goroutine drives it while READs or grants are live
	ProgressThread                    // NIXL's own thread, woken by UCX events or every ProgressDelay
	ProgressCaller                    // Check and DrainNotifs drive it: a producer's READs move as it drains
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

// ErrNotInstalled is New's error, wrapped, when NIXL cannot be loaded.
var ErrNotInstalled = errors.New("nixl: NIXL not found")

// EnvLib names the variable that gives libnixl_capi.so or its folder.
const EnvLib = "ECXFER_NIXL_LIB"
