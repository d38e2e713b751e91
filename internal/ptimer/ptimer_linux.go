package ptimer

import (
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// impl is a timerfd read by a goroutine through the runtime's poller; the
// Go timer serves if the timerfd cannot be made.
type impl struct {
	fd   int
	f    *os.File
	done chan struct{}
}

func (t *Timer) init() {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		t.initGo()
		return
	}
	t.fd, t.f, t.done = fd, os.NewFile(uintptr(fd), "timerfd"), make(chan struct{})
	go t.read(t.f, t.done)
}

// Raw system calls: a timerfd never blocks (the poller waits for it), and
// the ordinary calls would wake the runtime's monitor thread each time a
// process idle between waits arms or reads it.

func (t *Timer) read(f *os.File, done chan struct{}) {
	defer close(done)
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for rc.Read(readExpiries) == nil { // fails once closed
		t.fire()
	}
}

// readExpiries reads a timerfd's 8-byte count of expiries, for a RawConn's
// Read; false: none yet, the poller waits.
func readExpiries(fd uintptr) bool {
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

// arm sets the timer to fire after d; 0 disarms it.
func (t *Timer) arm(d time.Duration) {
	if t.f == nil {
		t.armGo(d)
		return
	}
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_, _, e := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(t.fd), 0, uintptr(unsafe.Pointer(&its)), 0, 0, 0)
	if e != 0 {
		t.fire() // cannot happen for a valid fd; a wake-up early is safe
	}
}

// Close stops the timer and ends its goroutine.
func (t *Timer) Close() error {
	if t.f == nil {
		t.gt.Stop()
		return nil
	}
	err := t.f.Close()
	<-t.done
	return err
}
