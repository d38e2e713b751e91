package wake

import (
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// impl is an eventfd that Wait reads through the runtime's poller, within
// a read deadline for the timeout. Where it cannot be made, the fallback
// serves.
type impl struct {
	f   *os.File
	rc  syscall.RawConn
	rfn func(fd uintptr) bool
	kfn func(fd uintptr)
	dfn func(fd uintptr)
	fallback
}

func (w *Waiter) init() {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		w.initFallback()
		return
	}
	f := os.NewFile(uintptr(fd), "wake")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		w.initFallback()
		return
	}
	// Bound once, as a closure per call would allocate. Through the
	// RawConn: a Wake racing Close never writes to a descriptor reused
	// since.
	w.f, w.rc = f, rc
	w.rfn, w.kfn = ReadCounter, addOne
	w.dfn = func(fd uintptr) { ReadCounter(fd) }
}

// Raw calls: an eventfd never blocks, and syscall.Read would wake the
// runtime's monitor thread (see transport's quietConn).

// ReadCounter reads the 8-byte counter of an eventfd or a timerfd (the
// wakes, the expiries), for a RawConn's Read; false: none yet, the poller
// waits.
func ReadCounter(fd uintptr) bool {
	var b [8]byte
	for {
		_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), 8)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		return true // read, or an error that waiting will not fix: do not spin
	}
}

func addOne(fd uintptr) {
	one := uint64(1)
	for {
		_, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&one)), 8)
		if e != unix.EINTR {
			return // EAGAIN only at a count of 2⁶⁴-2: readable anyway
		}
	}
}

func (w *Waiter) kick() {
	if w.f == nil {
		w.kickFallback()
		return
	}
	w.rc.Control(w.kfn)
}

// arm sets the timeout; d < 0: none.
func (w *Waiter) arm(d time.Duration) {
	if w.f == nil {
		w.armFallback(d)
		return
	}
	var t time.Time
	if d > 0 {
		t = time.Now().Add(d)
	}
	w.f.SetReadDeadline(t)
}

func (w *Waiter) drain() {
	if w.f == nil {
		w.drainFallback()
		return
	}
	w.rc.Control(w.dfn)
}

func (w *Waiter) block() {
	if w.f == nil {
		w.blockFallback()
		return
	}
	w.rc.Read(w.rfn) // fails at the deadline, or after Close
}

// Close releases the descriptor. The waiter must not be used after.
func (w *Waiter) Close() error {
	if w.f == nil {
		w.closeFallback()
		return nil
	}
	return w.f.Close()
}
