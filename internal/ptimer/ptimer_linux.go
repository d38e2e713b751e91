package ptimer

import (
	"os"
	"time"

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

func (t *Timer) read(f *os.File, done chan struct{}) {
	defer close(done)
	var b [8]byte // the count of expiries
	for {
		if _, err := f.Read(b[:]); err != nil {
			return // closed
		}
		t.fire()
	}
}

// arm sets the timer to fire after d; 0 disarms it.
func (t *Timer) arm(d time.Duration) {
	if t.f == nil {
		t.armGo(d)
		return
	}
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if unix.TimerfdSettime(t.fd, 0, &its, nil) != nil {
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
