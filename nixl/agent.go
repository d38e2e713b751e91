//go:build nixl || nixlfake

package nixl

/*
#include <stdlib.h>
#include "cnixl.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	_ "github.com/ianlancetaylor/cgosymbolizer" // symbolised C frames in crashes

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Agent is an xfer.DataTransport over a NIXL agent. It is safe for
// concurrent use.
type Agent struct {
	mu      sync.Mutex
	c       *C.cnixl_agent
	region  *cache.Region
	meta    []byte
	desc    []byte
	peers   map[string]int    // remote agent -> registrations
	byMeta  map[string]string // metadata blob -> remote agent loaded from it
	handles map[xfer.Handle]C.cnixl_handle
	zombies []C.cnixl_handle // released while running: released again later
	next    xfer.Handle
	closed  bool
}

var _ xfer.DataTransport = (*Agent)(nil)

// New creates a NIXL agent over region: it registers the region and
// prepares one descriptor per block.
func New(cfg Config, region *cache.Region) (*Agent, error) {
	if cfg.Name == "" {
		return nil, errors.New("nixl: agent name required")
	}
	if cfg.Backend == "" {
		cfg.Backend = "UCX"
	}
	name, backend := C.CString(cfg.Name), C.CString(cfg.Backend)
	defer C.free(unsafe.Pointer(name))
	defer C.free(unsafe.Pointer(backend))
	n := len(cfg.Params)
	keys := C.malloc(C.size_t(max(n, 1)) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	vals := C.malloc(C.size_t(max(n, 1)) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	defer C.free(keys)
	defer C.free(vals)
	ks, vs := unsafe.Slice((**C.char)(keys), max(n, 1)), unsafe.Slice((**C.char)(vals), max(n, 1))
	i := 0
	for k, v := range cfg.Params {
		ks[i], vs[i] = C.CString(k), C.CString(v)
		defer C.free(unsafe.Pointer(ks[i]))
		defer C.free(unsafe.Pointer(vs[i]))
		i++
	}
	pt := C.int(0)
	if cfg.ProgressThread {
		pt = 1
	}
	a := &Agent{region: region, peers: map[string]int{}, byMeta: map[string]string{}, handles: map[xfer.Handle]C.cnixl_handle{}}
	if st := C.cnixl_agent_new(name, backend, (**C.char)(keys), (**C.char)(vals), C.int(n), pt, &a.c); st != 0 {
		return nil, statusErr("create agent", int(st))
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
	a.desc = wire.AppendBlockDescs(nil, uint64(region.Base()), uint64(region.BlockSize()), region.Blocks(), 0)
	return a, nil
}

// AgentMetadata implements xfer.DataTransport.
func (a *Agent) AgentMetadata() []byte { return a.meta }

// MemDescriptor implements xfer.DataTransport.
func (a *Agent) MemDescriptor() []byte { return a.desc }

// AddRemotePeer implements xfer.DataTransport: it loads the remote agent
// and prepares its descriptor list from the mem descriptor, which must not
// be empty.
func (a *Agent) AddRemotePeer(metadata, memDescriptor []byte) (xfer.Peer, error) {
	descs, err := wire.DecodeMemDescs(memDescriptor)
	if err != nil {
		return xfer.Peer{}, fmt.Errorf("nixl: mem descriptor: %w", err)
	}
	if len(descs) == 0 || len(metadata) == 0 {
		return xfer.Peer{}, fmt.Errorf("nixl: %w: empty metadata or descriptor", ErrInvalidParam)
	}
	flat := make([]C.uint64_t, 0, 3*len(descs))
	for _, d := range descs {
		addr, ok1 := d.Addr.Uint64()
		size, ok2 := d.Size.Uint64()
		dev, ok3 := d.Device.Uint64()
		if !ok1 || !ok2 || !ok3 {
			return xfer.Peer{}, fmt.Errorf("nixl: %w: negative value in the descriptor", ErrInvalidParam)
		}
		flat = append(flat, C.uint64_t(addr), C.uint64_t(size), C.uint64_t(dev))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return xfer.Peer{}, xfer.ErrClosed
	}
	if agent, ok := a.byMeta[string(metadata)]; ok {
		// Loaded already by another registration: share it.
		a.peers[agent]++
		return xfer.Peer{Agent: agent, Blocks: len(descs)}, nil
	}
	var name *C.char
	st := C.cnixl_load_remote(a.c, unsafe.Pointer(unsafe.SliceData(metadata)), C.size_t(len(metadata)),
		unsafe.SliceData(flat), C.size_t(len(descs)), &name)
	if st != 0 {
		return xfer.Peer{}, statusErr("load remote metadata", int(st))
	}
	agent := C.GoString(name)
	C.cnixl_free(unsafe.Pointer(name))
	a.peers[agent]++
	a.byMeta[string(metadata)] = agent
	return xfer.Peer{Agent: agent, Blocks: len(descs)}, nil
}

// RemoveRemotePeer implements xfer.DataTransport.
func (a *Agent) RemoveRemotePeer(agent string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.peers[agent] == 0 {
		return fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	if a.peers[agent]--; a.peers[agent] > 0 {
		return nil
	}
	delete(a.peers, agent)
	for m, n := range a.byMeta {
		if n == agent {
			delete(a.byMeta, m)
		}
	}
	n := C.CString(agent)
	defer C.free(unsafe.Pointer(n))
	return statusErr("remove remote", int(C.cnixl_remove_remote(a.c, n)))
}

// PostRead implements xfer.DataTransport.
func (a *Agent) PostRead(local []int, agent string, remote []int, notif []byte) (xfer.Handle, error) {
	if len(local) != len(remote) {
		return 0, xfer.ErrLengthMismatch
	}
	ids := make([]C.int32_t, 2*len(local)+1)
	for i := range local {
		ids[i], ids[len(local)+i] = C.int32_t(local[i]), C.int32_t(remote[i])
	}
	n := C.CString(agent)
	defer C.free(unsafe.Pointer(n))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, xfer.ErrClosed
	}
	if a.peers[agent] == 0 {
		return 0, fmt.Errorf("%w: %s", xfer.ErrUnknownPeer, agent)
	}
	var np unsafe.Pointer
	if len(notif) > 0 {
		np = unsafe.Pointer(unsafe.SliceData(notif))
	}
	var h C.cnixl_handle
	st := C.cnixl_post_read(a.c, &ids[0], &ids[len(local)], C.int(len(local)), n, np, C.size_t(len(notif)), &h)
	if st != 0 {
		return 0, statusErr("post READ", int(st))
	}
	a.next++
	a.handles[a.next] = h
	return a.next, nil
}

// Check implements xfer.DataTransport. A READ NIXL reports failed is
// Failed; a request NIXL does not know is an error (the state is unknown).
func (a *Agent) Check(h xfer.Handle) (xfer.Progress, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.retryZombiesLocked()
	ch, ok := a.handles[h]
	if !ok {
		return 0, fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	switch st := int(C.cnixl_check(a.c, ch)); {
	case st == C.CNIXL_IN_PROG:
		return xfer.InProgress, nil
	case st == C.CNIXL_SUCCESS:
		return xfer.Complete, nil
	case st == C.CNIXL_ERR_NOT_FOUND:
		return 0, statusErr("check", st)
	default:
		return xfer.Failed, nil
	}
}

// Release implements xfer.DataTransport.
func (a *Agent) Release(h xfer.Handle) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch, ok := a.handles[h]
	if !ok {
		return fmt.Errorf("%w: %d", xfer.ErrUnknownHandle, h)
	}
	delete(a.handles, h)
	if st := int(C.cnixl_release(a.c, ch)); st != 0 {
		// NIXL could not abort it: keep the request to release later,
		// and say the blocks may still be written.
		a.zombies = append(a.zombies, ch)
		return fmt.Errorf("%w: %v", xfer.ErrMayStillWrite, statusErr("release", st))
	}
	return nil
}

func (a *Agent) retryZombiesLocked() {
	kept := a.zombies[:0]
	for _, z := range a.zombies {
		if C.cnixl_release(a.c, z) != 0 {
			kept = append(kept, z)
		}
	}
	a.zombies = kept
}

// DrainNotifs implements xfer.DataTransport.
func (a *Agent) DrainNotifs(dst []xfer.Notif) ([]xfer.Notif, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return dst, xfer.ErrClosed
	}
	a.retryZombiesLocked()
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.cnixl_get_notifs(a.c, &buf, &n); st != 0 {
		return dst, statusErr("get notifications", int(st))
	}
	if n == 0 {
		return dst, nil
	}
	b := C.GoBytes(buf, C.int(n))
	C.cnixl_free(buf)
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
		dst = append(dst, xfer.Notif{Agent: name, Msg: b[8+nl : 8+nl+ml : 8+nl+ml]})
		b = b[8+nl+ml:]
	}
	return dst, nil
}

// Close implements xfer.DataTransport: it releases every request and remote
// agent and deregisters the region. After Close nothing writes into it.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	C.cnixl_agent_destroy(a.c)
	a.c = nil
	clear(a.handles)
	clear(a.peers)
	clear(a.byMeta)
	a.zombies = nil
	return nil
}
