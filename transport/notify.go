package transport

import (
	"sync"
	"sync/atomic"
)

// notifiers are the functions to call when there is work for a loop: each
// is called on the goroutine that brought the work, after the work can be
// taken. Calls read a copied list without locking.
type notifiers struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*func()]
}

// add adds f; stop removes it, once, and waits for nothing: f may still be
// running, or be called once more by a call that read the list before.
func (n *notifiers) add(f func()) (stop func()) {
	fp := &f
	n.mu.Lock()
	var old []*func()
	if l := n.list.Load(); l != nil {
		old = *l
	}
	l := append(old[:len(old):len(old)], fp)
	n.list.Store(&l)
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			var cur []*func()
			for _, g := range *n.list.Load() {
				if g != fp {
					cur = append(cur, g)
				}
			}
			n.list.Store(&cur)
		})
	}
}

func (n *notifiers) call() {
	l := n.list.Load()
	if l == nil {
		return
	}
	for _, f := range *l {
		(*f)()
	}
}
