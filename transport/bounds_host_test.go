package transport

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

// The data port's connections are shared by remote host: one host's
// grants, however many, keep no other host out. Linux routes all of
// 127/8 to lo, so 127.0.0.x are distinct hosts on one machine.

// dialDataFrom connects to p's data port from the local address ip and sends
// a hello.
func dialDataFrom(t *testing.T, p *TCPData, ip string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	conn, err := d.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write(appendHello(nil, "raw", 0, nil))
	return conn
}

// rawConsumerFrom is rawConsumer dialing from the local address ip.
func rawConsumerFrom(t *testing.T, p *TCPData, ip string) net.Conn {
	t.Helper()
	conn := dialDataFrom(t, p, ip)
	if _, err := io.ReadFull(conn, make([]byte, headLen+proofLen)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// Hostile hosts prove every connection slot with grants of no blocks (a
// contact's), each grant on as many connections as it proves: a neighbour
// on another host still connects, and completes its READ with the right
// bytes, in place of one connection of the host holding the most.
func TestGranteesCannotLockOutAnotherHost(t *testing.T) {
	const maxConns = 16
	for _, tc := range []struct {
		name    string
		perHost int
		hosts   []string
	}{
		{"one host", maxConns, []string{"127.0.0.2"}},
		{"hosts at their cap", 0, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := newRegion(t, 8, 4096)
			p, g := gatedProducer(t, pr, TCPConfig{MaxConns: maxConns, MaxConnsPerHost: tc.perHost})
			per := maxConns / len(tc.hosts)
			id := uint64(0)
			for _, host := range tc.hosts {
				var notif []byte
				for i := range per {
					if i%maxProofConns == 0 {
						notif = g.grant()
					}
					id++
					proveConn(t, rawConsumerFrom(t, p, host), id, notif)
				}
			}
			until(t, "every connection proven", func() bool { return provenConns(p) == maxConns })
			if shed := p.Stats().ConnsShed; shed != 0 {
				t.Fatalf("%d connections shed while the hostile hosts connected", shed)
			}
			read := neighbour(t, p, pr, g)
			read(1)
			read(2)
			if shed := p.Stats().ConnsShed; shed != 1 {
				t.Fatalf("%d connections shed, want 1", shed)
			}
			if n := servedCount(p); n > maxConns {
				t.Fatalf("%d connections served, the bound is %d", n, maxConns)
			}
		})
	}
}

// At its host's cap a newcomer takes the place of one of its own host's
// connections, never another host's, even one never proven: the one whose
// proof ended (never proven first), else the one proven longest ago.
func TestConnsPerHostShedsItsOwnHost(t *testing.T) {
	const a, b = "127.0.0.2", "127.0.0.3"
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{MaxConns: 16, MaxConnsPerHost: 2})
	read := neighbour(t, p, pr, g)
	read(1)
	stranger := rawConsumerFrom(t, p, b) // holds no proof
	a1 := rawConsumerFrom(t, p, a)
	proveConn(t, a1, 1, g.grant())
	a2 := rawConsumerFrom(t, p, a)
	proveConn(t, a2, 1, g.grant())
	until(t, "every connection served", func() bool { return servedCount(p) == 4 })

	a3 := rawConsumerFrom(t, p, a) // a1 was proven longest ago
	expectClosed(t, a1, 5*time.Second)
	if shed := p.Stats().ConnsShed; shed != 1 {
		t.Fatalf("%d connections shed, want 1", shed)
	}
	rawConsumerFrom(t, p, a) // a3 holds no proof, a2 does
	expectClosed(t, a3, 5*time.Second)
	proveConn(t, a2, 2, g.grant())
	proveConn(t, stranger, 1, g.grant()) // another host's stranger stays
	if shed := p.Stats().ConnsShed; shed != 2 {
		t.Fatalf("%d connections shed, want 2", shed)
	}
	read(2)
}

// At MaxConns, with every connection proven, a newcomer whose host holds
// as many as the host holding the most is turned away: its host has its
// share. One from a host holding fewer takes the place of the most
// holding host's connection proven longest ago.
func TestConnCapTurnsAwayAHostWithItsShare(t *testing.T) {
	const a, b, c = "127.0.0.2", "127.0.0.3", "127.0.0.4"
	pr := newRegion(t, 8, 4096)
	p, g := gatedProducer(t, pr, TCPConfig{MaxConns: 4, MaxConnsPerHost: 3})
	var conns []net.Conn
	for i, host := range []string{a, b, a, b} {
		conn := rawConsumerFrom(t, p, host)
		proveConn(t, conn, 1, g.grant())
		conns = append(conns, conn)
		until(t, "the connection served", func() bool { return servedCount(p) == i+1 })
	}
	late := dialDataFrom(t, p, a)
	expectClosed(t, late, 5*time.Second)
	if shed := p.Stats().ConnsShed; shed != 1 {
		t.Fatalf("%d connections shed, want 1 (the newcomer)", shed)
	}
	for _, conn := range conns {
		proveConn(t, conn, 2, g.grant()) // every one kept
	}
	// a and b hold 2 each: one of them pays, with its connection proven
	// longest ago (conns[0] or conns[1]); the later ones stay.
	other := rawConsumerFrom(t, p, c)
	proveConn(t, other, 1, g.grant())
	if shed := p.Stats().ConnsShed; shed != 2 {
		t.Fatalf("%d connections shed, want 2", shed)
	}
	p.mu.Lock()
	na, nb, nc := p.hosts[a], p.hosts[b], p.hosts[c]
	p.mu.Unlock()
	if na+nb != 3 || nc != 1 {
		t.Fatalf("hosts hold %d, %d and %d connections, want 3 between a and b, and 1", na, nb, nc)
	}
	proveConn(t, conns[2], 3, g.grant())
	proveConn(t, conns[3], 3, g.grant())
}

// A connection proven by a grant of a session that then detached brings
// that grant's notification: it is dropped and counted, not handed to the
// one session live after it; a grant of that session's still reaches it.
func TestDetachedSessionsNotifReachesNoSuccessor(t *testing.T) {
	pr := newRegion(t, 8, 4096)
	p, a := gatedProducer(t, pr, TCPConfig{})
	conn := rawConsumer(t, p)
	na := a.grant(1)
	conn.Write(appendRead(nil, 1, na, 1, spans(nil, []int{1}), false))
	rawAnswer(t, conn, 1)
	b := attachGate(p)
	a.att.Detach()
	drops := p.Stats().NotifDrops
	conn.Write(appendNotify(nil, na))
	var got []xfer.Notif
	until(t, "the notification is handled", func() bool {
		got, _ = b.att.(*attachment).DrainNotifs(got)
		return len(got) > 0 || p.Stats().NotifDrops != drops
	})
	if len(got) != 0 {
		t.Fatalf("the successor was handed the detached session's notification %q", got[0].Msg)
	}
	nb := b.grant()
	conn.Write(appendNotify(nil, nb))
	until(t, "the successor's notification is drained", func() bool {
		got, _ = b.att.(*attachment).DrainNotifs(got)
		return len(got) > 0
	})
	if len(got) != 1 || string(got[0].Msg) != string(nb) {
		t.Fatalf("the successor drained %+v", got)
	}
}
