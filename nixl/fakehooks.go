//go:build nixlfake

package nixl

/*
#include <stdlib.h>
#include "cnixl_fake.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// Test hooks of the nixlfake build: they drive the C fake.

// fakeSetDelay makes every READ take d on its own thread.
func fakeSetDelay(d time.Duration) { C.cnixl_fake_set_delay_us(C.long(d / time.Microsecond)) }

// fakeSetInline makes READs complete within their post, as UCX over shared
// memory's do (on), or on their own thread after the delay (off).
func fakeSetInline(on bool) {
	v := 0
	if on {
		v = 1
	}
	C.cnixl_fake_set_inline(C.int(v))
}

// fakeSetHang makes READs on their own thread (fakeSetInline off) hang,
// as over a link that drops everything: they end only once it is called
// with false, or they are released, or their agent closes.
func fakeSetHang(on bool) {
	v := 0
	if on {
		v = 1
	}
	C.cnixl_fake_set_hang(C.int(v))
}

// Fake operations to fail.
const (
	fakePost    = C.CNIXL_FAKE_OP_POST
	fakeCheck   = C.CNIXL_FAKE_OP_CHECK
	fakeLoad    = C.CNIXL_FAKE_OP_LOAD
	fakeRelease = C.CNIXL_FAKE_OP_RELEASE
	fakeNew     = C.CNIXL_FAKE_OP_NEW
)

// fakeSetNixlDir sets the folder the fake says libnixl.so was loaded from.
func fakeSetNixlDir(dir string) {
	d := C.CString(dir)
	defer C.free(unsafe.Pointer(d))
	C.cnixl_fake_set_nixl_dir(d)
}

// fakeFail makes the next count calls of op fail with NIXL status st.
func fakeFail(op, st, count int) { C.cnixl_fake_fail(C.int(op), C.int(st), C.int(count)) }

// fakeLeaks returns the requests and remote agents a still holds in C.
func (a *Agent) fakeLeaks() (handles, remotes int) {
	a.lockC()
	defer a.unlockC()
	return a.fakeLeaksLocked()
}

// fakeLeaksLocked is fakeLeaks for a caller that holds cmu (the fake
// keeps its counts under a lock of its own).
func (a *Agent) fakeLeaksLocked() (handles, remotes int) {
	if a.c == nil {
		return 0, 0
	}
	return int(C.cnixl_fake_live_handles(a.c)), int(C.cnixl_fake_live_remotes(a.c))
}

// fakeHoldProgress makes a's progress calls (getNotifs) wait inside C
// until it is called with false, as a long progress call over UCX does;
// it returns once one waits. a must have a progress goroutine.
func (a *Agent) fakeHoldProgress(on bool) {
	v := 0
	if on {
		v = 1
	}
	C.cnixl_fake_hold_notifs(a.c, C.int(v))
	for on && C.cnixl_fake_in_notifs(a.c) == 0 {
		time.Sleep(100 * time.Microsecond)
	}
}

// fakeConnected reports whether NIXL was asked to connect to the remote
// agent key names (its load done).
func (a *Agent) fakeConnected(key string) bool {
	a.mu.Lock()
	name := a.peers[key].name
	a.mu.Unlock()
	if name == "" {
		return false
	}
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	a.cmu.Lock()
	defer a.cmu.Unlock()
	return C.cnixl_fake_connected(a.c, n) != 0
}
