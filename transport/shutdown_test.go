package transport

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
)

// Close while READs are being posted and released on other goroutines
// returns, every time: a READ routed to one of the peer's goroutines just
// as the peer shuts down is failed, never left in a channel its goroutine
// no longer reads (which kept the READ, and the producer's mapping, until
// Close waited forever for them).
func TestCloseRacingPostRead(t *testing.T) {
	const bs = 64 << 10
	pr := newSharedRegion(t, 16, bs)
	p, g := gatedProducer(t, pr, TCPConfig{})
	ids := []int{0, 1, 2, 3, 4, 5, 6, 7} // 512 KiB: the copy goroutine's
	notif := g.grant(ids...)
	for trial := range 100 {
		cr, err := cache.NewRegion(cache.RegionConfig{Blocks: 16, BlockSize: bs, NoLock: true})
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewTCPData(TCPConfig{Logger: quiet}, cr)
		if err != nil {
			t.Fatal(err)
		}
		peer, err := c.AddRemotePeer(p.AgentMetadata(), nil)
		if err != nil {
			t.Fatal(err)
		}
		warm(t, c, peer.Agent, g)
		stop := make(chan struct{})
		var posted atomic.Int64
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if h, err := c.PostRead(ids, peer.Agent, ids, notif); err == nil {
						posted.Add(1)
						c.Release(h)
					}
				}
			}()
		}
		poll(t, 10*time.Second, "READs under way", func() bool { return posted.Load() >= 8 })
		done := make(chan struct{})
		go func() { c.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("trial %d: Close did not return", trial)
		}
		close(stop)
		wg.Wait()
		cr.Close()
	}
}
