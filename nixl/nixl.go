// Package nixl is a data plane over NVIDIA NIXL, the library vLLM moves
// embeddings with (RDMA between machines; UCX also over TCP and shared
// memory), through cgo.
//
// Build tags:
//   - nixl: the real thing, over NIXL's C++ agent API (cnixl_nixl.cpp);
//     see the README for flags and UCX settings.
//   - nixlfake: the same Go and cgo code over an in-process C fake of the
//     same ABI (cnixl_fake.c), so CI exercises the cgo path: pointer rules,
//     handle lifetimes, error mapping.
//   - neither: the package compiles and New returns ErrNotBuilt.
//
// The agent registers the block region (memory-mapped, never Go heap) as
// DRAM with one transfer descriptor per block, so block i is descriptor i,
// exactly as the reference does. No Go pointer is kept by C.
//
// NIXL does not enforce grants: a peer that has our metadata can READ any
// registered block. The TCP data plane refuses what was not granted; with
// NIXL, keep producers on a trusted network.
package nixl

import "errors"

// Config configures an Agent.
type Config struct {
	Name    string // agent name; required and unique among peers
	Backend string // default "UCX"
	// Params are the backend's parameters, e.g.
	// {"ucx_error_handling_mode": "none"}, which UCX's shared-memory
	// transports need.
	Params map[string]string
	// ProgressThread runs NIXL's progress thread. Off by default: it
	// busy-spins a core; without it, Check and DrainNotifs drive progress.
	ProgressThread bool
}

// ErrNotBuilt is returned by New in builds without the nixl or nixlfake tag.
var ErrNotBuilt = errors.New("nixl: ecxfer was built without NIXL (build with -tags nixl)")

// NIXL's status codes as Go errors, one to one.
var (
	ErrNotPosted        = errors.New("nixl: not posted")
	ErrInvalidParam     = errors.New("nixl: invalid parameter")
	ErrBackend          = errors.New("nixl: backend error")
	ErrNotFound         = errors.New("nixl: not found")
	ErrMismatch         = errors.New("nixl: mismatch")
	ErrNotAllowed       = errors.New("nixl: not allowed")
	ErrRepostActive     = errors.New("nixl: repost of an active request")
	ErrUnknown          = errors.New("nixl: unknown error")
	ErrNotSupported     = errors.New("nixl: not supported")
	ErrRemoteDisconnect = errors.New("nixl: remote disconnected")
	ErrCanceled         = errors.New("nixl: canceled")
	ErrNoTelemetry      = errors.New("nixl: no telemetry")
)
