package wake

import (
	"sync"
	"sync/atomic"
)

// Hooks are the functions to call when there is work for a loop (a
// Waiter's Wake, typically): each is called on the goroutine that brought
// the work, after the work can be taken. Call reads a copied list without
// locking. The zero value is ready.
type Hooks struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*func()]
}

// Add adds f; stop removes it, once. It waits for nothing: f may still be
// running, or be called once more by a Call that read the list before.
func (h *Hooks) Add(f func()) (stop func()) {
	fp := &f
	h.mu.Lock()
	var old []*func()
	if l := h.list.Load(); l != nil {
		old = *l
	}
	l := append(old[:len(old):len(old)], fp)
	h.list.Store(&l)
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			var cur []*func()
			for _, g := range *h.list.Load() {
				if g != fp {
					cur = append(cur, g)
				}
			}
			h.list.Store(&cur)
		})
	}
}

// Call calls the functions.
func (h *Hooks) Call() {
	l := h.list.Load()
	if l == nil {
		return
	}
	for _, f := range *l {
		(*f)()
	}
}
