package transport

import (
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// BenchmarkConnFootprint measures what one idle connection costs the side
// that accepts it, everything included (zmq4's, the guard's, the data
// plane's buffers, and goroutine stacks): a consumer's handshaken
// connection to a Server, and a connection to a TCPData's port that sent
// its hello. It reports B/conn and goroutines/conn; docs/operations.md
// multiplies them by the connection bounds.
func BenchmarkConnFootprint(b *testing.B) {
	const n = 128 // connections per measure: within the per-host caps
	b.Run("control", func(b *testing.B) {
		s := newServer(b, ServerConfig{})
		rawConsumers(b, s, "warm")
		for i := range b.N {
			ids := make([]string, n)
			for j := range ids {
				ids[j] = "c" + strconv.Itoa(i*n+j)
			}
			footprint(b, n, func() func() {
				cs := rawConsumers(b, s, ids...)
				return func() {
					for _, c := range cs {
						c.Close()
					}
				}
			})
		}
	})
	b.Run("data", func(b *testing.B) {
		p := newTCP(b, newRegion(b, 8, 4096), TCPConfig{Listen: "127.0.0.1:0"})
		addr := p.Addr().String()
		for range b.N {
			footprint(b, n, func() func() {
				var cs []net.Conn
				for range n {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						b.Fatal(err)
					}
					c.Write(appendHello(nil, "footprint", 1<<20, nil))
					cs = append(cs, c)
				}
				for _, c := range cs { // the welcome: the hello was taken
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if _, err := c.Read(make([]byte, 1)); err != nil {
						b.Fatalf("no welcome: %v", err)
					}
				}
				return func() {
					for _, c := range cs {
						c.Close()
					}
					for end := time.Now().Add(5 * time.Second); servedConns(p) > 0; time.Sleep(time.Millisecond) {
						if time.Now().After(end) {
							b.Fatalf("%d connections still served", servedConns(p))
						}
					}
				}
			})
		}
	})
}

// footprint reports the heap and stacks in use, and the goroutines, that
// open's n connections add; open returns how to close them.
func footprint(b *testing.B, n int, open func() (closeAll func())) {
	b.Helper()
	b.StopTimer()
	before, g0 := inUse()
	b.StartTimer()
	closeAll := open()
	b.StopTimer()
	after, g1 := inUse()
	closeAll()
	b.ReportMetric(float64(int64(after)-int64(before))/float64(n), "B/conn")
	b.ReportMetric(float64(g1-g0)/float64(n), "goroutines/conn")
	b.StartTimer()
}

// inUse returns the heap and stack bytes in use after a collection, and
// the goroutines.
func inUse() (uint64, int) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse, runtime.NumGoroutine()
}

func servedConns(p *TCPData) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.served)
}
