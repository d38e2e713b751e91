package transport

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"time"
)

// The same-host channel. A Server listening on TCP on Linux also listens
// on a Unix-domain socket with a random name in the abstract namespace. A
// Go Client whose TCP connection reaches its own host asks for it, once,
// with an ECXFER-LOCAL command after the handshake (libzmq drops commands
// it does not know, so a Python producer never answers). The server
// answers on that connection with the socket's name, a ticket and a key,
// all fresh for this connection. The client dials the name, sends the
// ticket and a random challenge, and takes the socket only if the answer
// is HMAC-SHA256(key, challenge, address), the address being the one its
// TCP connection reached, as the server saw it. The key went only over
// that TCP connection, so only the server at the address the user named
// can answer: not a process that took the name after the server died, nor
// a server at another address passing on another server's offer. A
// ticket is good once, and lives no longer than its TCP connection.
//
// The client moves to the Unix-domain connection when no request of its
// is unanswered on the TCP one (a session matches replies to requests in
// order), then closes the TCP one. Until then, and for good where the
// offer, the dial or the proof fails, it stays on TCP.

const (
	localCmd       = "ECXFER-LOCAL"
	localVersion   = 1
	localMagic     = "ECXFLOC1" // the first bytes on the same-host socket
	localTicketLen = 16
	localKeyLen    = 32
	localChalLen   = 32
	localNameHex   = 32
)

// localPrefix starts every same-host socket's name; a client dials no
// other (an offer from a hostile server names no other service's socket).
const localPrefix = "@ecxfer-ctl-"

// localCommand is a command frame ECXFER-LOCAL with body.
func localCommand(body []byte) []byte {
	n := 1 + len(localCmd) + len(body)
	b := make([]byte, 0, 9+n)
	if n > 255 {
		b = append(b, flagCommand|flagLong)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	} else {
		b = append(b, flagCommand, byte(n))
	}
	b = append(b, byte(len(localCmd)))
	b = append(b, localCmd...)
	return append(b, body...)
}

// localQuery is a client's request for the same-host socket.
var localQuery = localCommand([]byte{localVersion})

// localOffer is a server's answer: where, and what proves it.
type localOffer struct {
	name   string
	ticket [localTicketLen]byte
	key    [localKeyLen]byte
}

func (o *localOffer) encode() []byte {
	b := make([]byte, 0, 1+localTicketLen+localKeyLen+len(o.name))
	b = append(b, localVersion)
	b = append(b, o.ticket[:]...)
	b = append(b, o.key[:]...)
	return localCommand(append(b, o.name...))
}

// parseLocalOffer reads an offer's body; it takes only names of our own
// form.
func parseLocalOffer(body []byte) (localOffer, bool) {
	var o localOffer
	if len(body) != 1+localTicketLen+localKeyLen+len(localPrefix)+localNameHex || body[0] != localVersion {
		return o, false
	}
	body = body[1:]
	body = body[copy(o.ticket[:], body):]
	body = body[copy(o.key[:], body):]
	o.name = string(body)
	if !strings.HasPrefix(o.name, localPrefix) {
		return o, false
	}
	if _, err := hex.DecodeString(o.name[len(localPrefix):]); err != nil {
		return o, false
	}
	return o, true
}

// localMAC is the proof the server sends: bound to the challenge and to
// the TCP address the ticket's connection reached.
func localMAC(key, challenge []byte, addr string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ecxfer same-host control v1\x00"))
	m.Write(challenge)
	m.Write(binary.BigEndian.AppendUint32(nil, uint32(len(addr))))
	m.Write([]byte(addr))
	return m.Sum(nil)
}

// localTicket is what a ticket redeems.
type localTicket struct {
	key   [localKeyLen]byte
	addr  string     // the TCP connection's local address
	owner *guardConn // that connection
}

// localSupported says whether this OS has the abstract namespace.
var localSupported = runtime.GOOS == "linux"

// listenLocal binds a same-host socket under a fresh random name.
func listenLocal() (net.Listener, error) {
	var r [localNameHex / 2]byte
	rand.Read(r[:])
	return net.Listen("unix", localPrefix+hex.EncodeToString(r[:]))
}

// offerLocked makes g's offer, replacing one it was made before; under mu.
// nil: no same-host socket.
func (l *guardListener) offerLocked(g *guardConn) []byte {
	if l.local == nil {
		return nil
	}
	if old, ok := l.ticketOf[g]; ok {
		delete(l.tickets, old)
	}
	o := localOffer{name: l.localName}
	rand.Read(o.ticket[:])
	rand.Read(o.key[:])
	l.tickets[o.ticket] = localTicket{key: o.key, addr: g.LocalAddr().String(), owner: g}
	l.ticketOf[g] = o.ticket
	return o.encode()
}

// forgetTicketLocked drops g's ticket, if any; under mu.
func (l *guardListener) forgetTicketLocked(g *guardConn) {
	if t, ok := l.ticketOf[g]; ok {
		delete(l.tickets, t)
		delete(l.ticketOf, g)
	}
}

// redeem takes the ticket a same-host connection presents and answers its
// challenge (under the handshake's deadline).
func (l *guardListener) redeem(c net.Conn) error {
	var hello [len(localMagic) + localTicketLen + localChalLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return err
	}
	if string(hello[:len(localMagic)]) != localMagic {
		return errors.New("not a same-host hello")
	}
	var t [localTicketLen]byte
	copy(t[:], hello[len(localMagic):])
	l.mu.Lock()
	tk, ok := l.tickets[t]
	if ok {
		delete(l.tickets, t)
		delete(l.ticketOf, tk.owner)
	}
	l.mu.Unlock()
	if !ok {
		return errors.New("unknown ticket")
	}
	_, err := c.Write(localMAC(tk.key[:], hello[len(localMagic)+localTicketLen:], tk.addr))
	return err
}

// proveLocal is the client's side of redeem: it sends o's ticket and a
// challenge and checks the answer against addr, the TCP address it dialed.
func proveLocal(c net.Conn, o localOffer, addr string, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	hello := make([]byte, 0, len(localMagic)+localTicketLen+localChalLen)
	hello = append(hello, localMagic...)
	hello = append(hello, o.ticket[:]...)
	var ch [localChalLen]byte
	rand.Read(ch[:])
	hello = append(hello, ch[:]...)
	if _, err := c.Write(hello); err != nil {
		return err
	}
	var got [sha256.Size]byte
	if _, err := io.ReadFull(c, got[:]); err != nil {
		return fmt.Errorf("same-host proof: %w", err)
	}
	if !hmac.Equal(got[:], localMAC(o.key[:], ch[:], addr)) {
		return errors.New("same-host proof: wrong answer")
	}
	return nil
}

// reachesThisHost says whether a TCP connection reaches this host: over loopback,
// or to the address it leaves from.
func reachesThisHost(local, remote net.Addr) bool {
	l, lok := local.(*net.TCPAddr)
	r, rok := remote.(*net.TCPAddr)
	return lok && rok && (r.IP.IsLoopback() || r.IP.Equal(l.IP))
}
