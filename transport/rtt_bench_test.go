package transport

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/ecxfer/ecxfer/internal/pybench"
	"github.com/ecxfer/ecxfer/xfer"
)

// BenchmarkControlRTT measures request/reply round trips over loopback with
// one outstanding 200-byte request, in one run, for: our Client and Server;
// bare zmq4 DEALER/ROUTER and the same sockets behind the guard (the
// guard's cost); a pyzmq DEALER against our Server; and pyzmq against
// pyzmq. Each reports rtt/s and p50-µs.
func BenchmarkControlRTT(b *testing.B) {
	payload := make([]byte, 200)
	b.Run("ours", func(b *testing.B) {
		s := newServer(b, ServerConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go serveEcho(ctx, s)
		c := newClient(b, ClientConfig{})
		var in []xfer.Inbound
		rtt(b, func() {
			c.Send(s.Endpoint(), payload)
			for len(in) == 0 {
				c.Wait(ctx)
				in = c.Drain(in)
			}
			in = in[:0]
		})
	})
	zmq4Pair := func(b *testing.B, guarded bool) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		srvEP, cliEP := "tcp://"+addr, "tcp://"+addr
		if guarded {
			var st controlCounters
			g := newGuardConfig(64<<10, time.Second, 0, 0, 0, 0, 0, &st)
			var f1, f2 func()
			srvEP, f1, _ = guardEndpoint(g, endpoint{"tcp", addr})
			cliEP, f2, _ = guardEndpoint(newGuardConfig(64<<20, 5*time.Second, 0, 0, 0, 0, 0, &st), endpoint{"tcp", addr})
			defer f1()
			defer f2()
		}
		r := zmq4.NewRouter(context.Background(), zmq4.WithLogger(discardLog))
		defer r.Close()
		if err := r.Listen(srvEP); err != nil {
			b.Fatal(err)
		}
		go func() {
			for {
				m, err := r.Recv()
				if err != nil {
					return
				}
				r.SendMulti(m)
			}
		}()
		d := zmq4.NewDealer(context.Background(), zmq4.WithLogger(discardLog))
		defer d.Close()
		if err := d.Dial(cliEP); err != nil {
			b.Fatal(err)
		}
		rtt(b, func() {
			d.SendMulti(zmq4.NewMsgFrom(nil, payload))
			if _, err := d.Recv(); err != nil {
				b.Fatal(err)
			}
		})
	}
	b.Run("zmq4-bare", func(b *testing.B) { zmq4Pair(b, false) })
	b.Run("zmq4-guarded", func(b *testing.B) { zmq4Pair(b, true) })
	b.Run("pyzmq-to-ours", func(b *testing.B) {
		requirePyzmq(b)
		s := newServer(b, ServerConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go serveEcho(ctx, s)
		pyRTT(b, s.Endpoint())
	})
	b.Run("pyzmq-to-pyzmq", func(b *testing.B) {
		requirePyzmq(b)
		pyRTT(b, "unused", "tcp://"+freePort(b))
	})
}

// rtt runs one round trip per iteration and reports rate and median.
func rtt(b *testing.B, once func()) {
	for range 200 {
		once()
	}
	lat := make([]time.Duration, 0, b.N)
	start := time.Now()
	b.ResetTimer()
	for b.Loop() {
		t := time.Now()
		once()
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/time.Since(start).Seconds(), "rtt/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
}

// pyRTT runs the pyzmq DEALER benchmark once for 2 s (pybench.Short
// under -benchtime 1x) and reports its numbers.
func pyRTT(b *testing.B, args ...string) {
	secs := pybench.Seconds(2 * time.Second)
	pybench.Run(b, python, append([]string{pyScript("py_dealer_bench.py"), args[0], secs}, args[1:]...)...)
}

// serveEcho answers every request with its own payload until ctx ends,
// where it arrives (OnRequest, as connector.Producer serves) or, when
// that is busy, on this goroutine.
func serveEcho(ctx context.Context, s *Server) {
	var mu sync.Mutex
	var msgs []xfer.Message
	echo := func() {
		msgs = s.Drain(msgs[:0])
		for _, m := range msgs {
			s.Reply(m.Identity, m.Payload)
		}
	}
	s.onRequestHook(func() {
		if mu.TryLock() {
			echo()
			mu.Unlock()
		}
	})
	defer s.onRequestHook(nil)
	for s.Wait(ctx) {
		mu.Lock()
		echo()
		mu.Unlock()
	}
}
