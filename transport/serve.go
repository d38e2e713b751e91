package transport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/xfer"
)

// The producer's side: one goroutine per consumer connection answers its
// READs in order, writing the granted blocks straight out of the region.
// Anything malformed closes that connection only.

// maxQueuedNotifs bounds the notifications of READs that cannot complete
// an attachment keeps for its session (attachment.broke).
const maxQueuedNotifs = 1 << 16

// connNotifBytes bounds what the notifications one served connection
// queued, and DrainNotifs has not taken, hold: each costs its length and
// notifCost. A connection at the bound waits for a drain; so a peer that
// floods notifications holds no more than this, and never takes a
// neighbour's room. maxNotifBytes bounds them for every connection
// together, closed ones included (what they queued stays until drained):
// a connection that would go past it waits for room the same way.
const (
	connNotifBytes = 256 << 10
	maxNotifBytes  = 64 << 20
	notifCost      = 64
)

// maxProofConns bounds the connections one grant proves: a consumer
// reads a producer over TCPConfig.Conns connections (2 by default) and
// makes contact on one.
const maxProofConns = 4

// answerGrace is how long past its grant's time left (plane.Hold.Left) a
// READ's answer may still be written.
const answerGrace = time.Second

// servedConn is a consumer's connection a producer serves: its answers and
// pushes take turns on it under wmu.
type servedConn struct {
	c    net.Conn
	d    *TCPData
	gone chan struct{} // closed with c (close)
	shut sync.Once
	// Read by Drains while the producer steps (see stepReads): the bytes
	// they read and left for the serve goroutine, under smu.
	smu   sync.Mutex
	pre   []byte
	hot   atomic.Bool
	cool  chan struct{}
	empty int       // Drains in a row that found nothing, under smu
	nb    *nbWriter // for pushes, which must not wait
	wmu   sync.Mutex
	agent string // as its hello named it: a label
	room  int    // bytes of pushes the consumer keeps for it; 0: none
	// host is its peer's IP address, whose share of the connections it
	// counts in (see TCPConfig.MaxConnsPerHost); seq orders the
	// connections as they were accepted; until is when its proof ends
	// (d.now; 0: never proven), at when it was last proven, proof the
	// grant that proved it and under the attachment whose gate holds that
	// grant (nil: TCPConfig.Authorize's alone), set under d.pmu (see
	// prove).
	host  string
	seq   uint64
	until atomic.Int64
	at    atomic.Int64
	proof atomic.Uint64
	under atomic.Pointer[attachment]
	// Its notifications' share of the queue (see connNotifBytes), and
	// whether it waits for room in its share (full) or in the queue
	// (waitsAll), under d.mu; a drain that makes room sends on drained.
	queued   int
	full     bool
	waitsAll bool
	drained  chan struct{}
	// Where it takes pushes: the consumer sessions whose grants it
	// presented, in att. Its serve goroutine's own.
	att   *attachment
	bound []uint64
	// a push's scratch, under wmu
	frame []byte
	bufs  [][]byte
	runs  [][2]int
	// The last grants pushed on it (fingerprints of the notification and
	// the blocks), under wmu: a READ of one of them comes after its push
	// on this connection, and is answered "pushed", without the bytes.
	recent [64][2]uint64
	next   int
}

// fnv1a folds words into an FNV-1a fingerprint.
func fnv1a[T byte | int](ws []T) uint64 {
	h := uint64(14695981039346656037)
	for _, w := range ws {
		h = (h ^ uint64(w)) * 1099511628211
	}
	return h | 1 // never 0: an empty slot
}

// pushed records a push of notif's grant, of blocks, on s; under wmu.
func (s *servedConn) pushed(notif []byte, blocks []int) {
	s.recent[s.next] = [2]uint64{fnv1a(notif), fnv1a(blocks)}
	s.next = (s.next + 1) % len(s.recent)
}

// wasPushed reports whether notif's grant, with exactly ids, was pushed on
// s lately, and forgets it.
func (s *servedConn) wasPushed(notif []byte, ids []int) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	key := [2]uint64{fnv1a(notif), fnv1a(ids)}
	for i := range s.recent {
		if s.recent[i] == key {
			s.recent[i] = [2]uint64{}
			return true
		}
	}
	return false
}

func (d *TCPData) accept() {
	defer d.wg.Done()
	backoff := time.Millisecond
	for {
		c, err := d.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(backoff) // EMFILE and friends: do not spin
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		if tc, ok := c.(*net.TCPConn); ok {
			tuneConn(tc)
		}
		s := &servedConn{c: quietIO(c), d: d, gone: make(chan struct{}), cool: make(chan struct{}, 1),
			drained: make(chan struct{}, 1), host: remoteHost(c)}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			c.Close()
			return
		}
		if !d.admitLocked(s.host) {
			// Every connection holds a live proof, and no host holds more
			// than the newcomer's: it waits for one to end.
			// Counted before the close, so that a peer that sees the close
			// sees the count.
			d.connsShed.Add(1)
			if d.connEnded != nil {
				d.connEnded(c.RemoteAddr())
			}
			d.mu.Unlock()
			c.Close()
			continue
		}
		d.acceptSeq++
		s.seq = d.acceptSeq
		d.served[s] = struct{}{}
		if d.hosts == nil {
			d.hosts = map[string]int{}
		}
		d.hosts[s.host]++
		d.wg.Add(1)
		d.mu.Unlock()
		go d.serve(s)
	}
}

// remoteHost is the IP address c comes from: the connections are
// shared by it.
func remoteHost(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	h, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return h
}

// admitLocked makes room for a newcomer from host, by the rule of
// TCPConfig.MaxConns: the slots are shared fairly by remote host. false:
// there is none to make, the newcomer is refused. Under d.mu; one pass
// over the connections at most, and none below the caps.
func (d *TCPData) admitLocked(host string) bool {
	now := d.now()
	var v *servedConn
	switch {
	case d.hosts[host] >= d.cfg.MaxConnsPerHost:
		v = d.victimLocked(now, host, false, true)
	case len(d.served) >= d.cfg.MaxConns:
		// Those whose proof ended, anywhere, go first; then the host
		// holding the most pays, if that is not the newcomer's share.
		top, most := "", 0
		for h, n := range d.hosts {
			if n > most {
				top, most = h, n
			}
		}
		v = d.victimLocked(now, top, true, most > d.hosts[host])
	default:
		return true
	}
	if v == nil {
		return false
	}
	d.dropLocked(v)
	d.connsShed.Add(1)
	v.close() // its goroutine ends as it sees the close
	return true
}

// victimLocked picks the connection to shed: of those whose proof ended,
// host's (every host's, if anyEnded), the one that ended longest ago
// (those never proven first, the oldest first); if there is none, and
// hostLive is set, host's proven longest ago. nil: none. Under d.mu.
func (d *TCPData) victimLocked(now int64, host string, anyEnded, hostLive bool) *servedConn {
	var v *servedConn
	var vLive bool
	var vKey int64
	for s := range d.served {
		u := s.until.Load()
		live := u > now
		if live && (!hostLive || s.host != host) || !live && !anyEnded && s.host != host {
			continue
		}
		key := u
		if live {
			key = s.at.Load()
		}
		if v == nil || !live && vLive || live == vLive && (key < vKey || key == vKey && s.seq < v.seq) {
			v, vLive, vKey = s, live, key
		}
	}
	return v
}

// dropLocked forgets s, shed or closed, if it is still served. Under d.mu.
func (d *TCPData) dropLocked(s *servedConn) {
	if _, ok := d.served[s]; !ok {
		return
	}
	delete(d.served, s)
	if d.connEnded != nil {
		d.connEnded(s.c.RemoteAddr())
	}
	if d.hosts[s.host]--; d.hosts[s.host] <= 0 {
		delete(d.hosts, s.host)
	}
}

// now is the clock of the proofs: monotonic, run ahead by tests.
func (d *TCPData) now() int64 { return monoNow() + d.clockAhead.Load() }

// proven reports whether s holds a live proof.
func (d *TCPData) proven(s *servedConn) bool { return s.until.Load() > d.now() }

// prove notes that s presented the grant notif names, which a gate holds
// live with left time left (0: unknown, IdleTimeout then): s is proven
// until then and the answer's grace, as long as the grant may live. A
// grant proves maxProofConns connections at most; a connection one more
// presents keeps the proof it had. a is the attachment whose gate holds
// the grant (nil: TCPConfig.Authorize's alone).
func (d *TCPData) prove(s *servedConn, a *attachment, notif []byte, left time.Duration) {
	if left <= 0 {
		left = d.cfg.IdleTimeout
	}
	now := d.now()
	until := now + int64(left+answerGrace)
	key := fnv1a(notif)
	if s.proof.Load() == key { // only s's reader proves s
		s.under.Store(a)
		s.at.Store(now)
		s.until.Store(until)
		return
	}
	d.pmu.Lock()
	defer d.pmu.Unlock()
	by := d.proofs[key]
	i := slices.Index(by[:], nil)
	if i < 0 {
		return
	}
	d.unproveLocked(s)
	by[i] = s
	d.proofs[key] = by
	s.proof.Store(key)
	s.under.Store(a)
	s.at.Store(now)
	s.until.Store(until)
}

// unprove forgets s's grant, as s closes: its place in the grant's
// proofs is free.
func (d *TCPData) unprove(s *servedConn) {
	d.pmu.Lock()
	d.unproveLocked(s)
	d.pmu.Unlock()
}

func (d *TCPData) unproveLocked(s *servedConn) {
	key := s.proof.Load()
	if key == 0 {
		return
	}
	by := d.proofs[key]
	for i := range by {
		if by[i] == s {
			by[i] = nil
		}
	}
	if by == ([maxProofConns]*servedConn{}) {
		delete(d.proofs, key)
	} else {
		d.proofs[key] = by
	}
	s.proof.Store(0)
	s.under.Store(nil)
}

// leftOf is what a grant h holds, under a's gate, has left, as far as
// the plane can tell: the hold's word, else the session's lease.
func leftOf(h plane.Hold, a *attachment) time.Duration {
	if h.Left <= 0 && a != nil {
		return a.lease
	}
	return h.Left
}

// server is what serve keeps of one connection.
type server struct {
	d        *TCPData
	s        *servedConn
	r        *bufio.Reader
	in       *deadlineReader
	buf      [16]byte
	awaiting map[uint64]awaited // served READs whose done has not come
	ids      []int
	runs     [][2]int
	out      net.Buffers
	head     []byte
	notif    []byte
	scratch  []byte
	// pend are the attachments (nil: none live) whose notifications were
	// queued since their hooks last ran.
	pend []*attachment
}

// note notes that a notification was queued for a.
func (v *server) note(a *attachment) {
	if !slices.Contains(v.pend, a) {
		v.pend = append(v.pend, a)
	}
}

// flush runs the hooks of the attachments noted: one call for a burst.
func (v *server) flush() {
	for _, a := range v.pend {
		v.d.notified(a)
	}
	clear(v.pend)
	v.pend = v.pend[:0]
}

// serve answers one consumer's READs in order.
func (d *TCPData) serve(s *servedConn) {
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		d.dropLocked(s)
		d.mu.Unlock()
		d.unprove(s)
		s.close()
		s.unbind()
	}()
	in := &deadlineReader{c: s.c, timeout: d.cfg.IOTimeout, progress: true}
	v := &server{d: d, s: s, in: in, r: bufio.NewReaderSize(preReader{s, in}, 4096), awaiting: map[uint64]awaited{},
		notif: make([]byte, maxNotifLen), scratch: make([]byte, 16<<10)}
	defer func() {
		v.brokeAll()
		v.flush()
	}()
	// The hello comes whole within the hello timeout, however it trickles.
	in.progress = false
	s.c.SetReadDeadline(time.Now().Add(d.cfg.helloTimeout()))
	if !v.hello() {
		return
	}
	for v.frame() {
	}
}

// hello reads the consumer's hello and answers the welcome.
func (v *server) hello() bool {
	typ, err := readHead(v.r, v.buf[:])
	if err != nil || typ != frameHello {
		return false
	}
	nl, ok := readLen(v.r, v.buf[:], maxNameLen)
	if !ok {
		return false
	}
	name := make([]byte, nl)
	var tail [4 + challengeLen]byte
	if _, err := io.ReadFull(v.r, name); err != nil {
		return false
	}
	if _, err := io.ReadFull(v.r, tail[:]); err != nil {
		return false
	}
	s := v.s
	s.agent, s.room = string(name), int(binary.BigEndian.Uint32(tail[:]))
	if v.d.cfg.NoPush {
		s.room = 0
	}
	if s.room > 0 {
		s.nb = newNBWriter(s.c)
	}
	var answer []byte
	if challenge := tail[4:]; v.d.token != nil && !bytes.Equal(challenge, make([]byte, challengeLen)) {
		answer = v.d.welcomeProof(challenge)
	}
	return v.write(net.Buffers{appendWelcome(nil, answer)}) == nil
}

// frame takes one frame from the consumer; false: the connection ends.
func (v *server) frame() bool {
	if len(v.pend) > 0 && v.r.Buffered() == 0 {
		v.flush() // the frames read so far are handled
	}
	for v.s.hot.Load() { // Drains read it (see stepReads)
		select {
		case <-v.s.cool:
		case <-v.s.gone:
			return false
		}
	}
	// Idle until a frame starts; then no more than IOTimeout without a
	// byte.
	v.in.progress = false
	v.s.c.SetReadDeadline(time.Now().Add(v.d.cfg.IdleTimeout))
	if _, err := v.r.Peek(1); err != nil {
		return false
	}
	v.in.progress = true
	typ, err := readHead(v.r, v.buf[:])
	if err != nil {
		return false
	}
	switch typ {
	case frameRead:
		return v.read()
	case frameDone:
		if _, err := io.ReadFull(v.r, v.buf[:8]); err != nil {
			return false
		}
		id := binary.BigEndian.Uint64(v.buf[:8])
		if w, ok := v.awaiting[id]; ok {
			if !v.queue(w.notif, w.att) {
				return false // still awaited: brokeAll hands it to its session
			}
			delete(v.awaiting, id)
		}
		return true
	case frameNotify:
		// A READ landed from our shared region or from a push: the
		// session matches the notification, and its token, to the grant.
		nl, ok := readLen(v.r, v.buf[:], maxNotifLen)
		if !ok {
			return false
		}
		if _, err := io.ReadFull(v.r, v.notif[:nl]); err != nil {
			return false
		}
		if a, ok := v.d.route(v.s, v.notif[:nl]); ok && !v.queue(bytes.Clone(v.notif[:nl]), a) {
			return false
		}
		if v.r.Buffered() == 0 && len(v.awaiting) == 0 {
			// Notifications alone: while the producer steps, its Drains
			// may read them.
			v.flush()
			v.d.steps.heat(v.s)
		}
		return true
	}
	return false
}

// close closes the connection, waking its serve goroutine if it waits to
// be cooled.
func (s *servedConn) close() {
	s.shut.Do(func() { close(s.gone) })
	s.c.Close()
}

// preReader is what a served connection's reader reads: the bytes Drains
// left, then the network.
type preReader struct {
	s *servedConn
	r io.Reader
}

func (p preReader) Read(b []byte) (int, error) {
	s := p.s
	s.smu.Lock()
	if len(s.pre) > 0 {
		n := copy(b, s.pre)
		if s.pre = s.pre[n:]; len(s.pre) == 0 {
			s.pre = nil
		}
		s.smu.Unlock()
		return n, nil
	}
	s.smu.Unlock()
	return p.r.Read(b)
}

// setHot implements stepConn.
func (s *servedConn) setHot(on bool) bool {
	if _, ok := s.c.(*quietConn); on && !ok {
		return false
	}
	s.smu.Lock()
	defer s.smu.Unlock()
	if on {
		select {
		case <-s.gone:
			return false
		default:
		}
		if len(s.pre) > 0 {
			return false
		}
	}
	s.hot.Store(on)
	s.empty = 0
	return true
}

// wake implements stepConn.
func (s *servedConn) wake() {
	select {
	case s.cool <- struct{}{}:
	default:
	}
}

// readNow implements stepConn: it takes the notifications that came whole;
// anything else (a READ, a frame in part, a full queue, an error) is left
// to the serve goroutine, which handles it as it always does.
func (s *servedConn) readNow(buf []byte) bool {
	if !s.smu.TryLock() {
		return true
	}
	defer s.smu.Unlock()
	n, err := s.c.(*quietConn).tryRead(buf)
	if n > 0 {
		s.empty = 0
		s.pre = append(s.pre, buf[:n]...)
	}
	for len(s.pre) >= headLen+2 && string(s.pre[:4]) == frameMagic && s.pre[4] == frameNotify {
		nl := int(binary.BigEndian.Uint16(s.pre[headLen:]))
		if nl > maxNotifLen || len(s.pre) < headLen+2+nl {
			break
		}
		msg := s.pre[headLen+2 : headLen+2+nl]
		if a, ok := s.d.route(s, msg); ok && !s.d.queueNotif(s, a, bytes.Clone(msg)) {
			break // at its bound: its goroutine waits for room
		} else if ok {
			s.d.owe(a)
		}
		s.pre = s.pre[headLen+2+nl:]
	}
	switch {
	case len(s.pre) > 0:
		return false
	case errors.Is(err, errNothing):
		s.pre = nil
		s.empty++
		return s.empty < idleDrains
	case err != nil:
		return false
	}
	s.pre = nil
	return true
}

// awaited is a READ served and not confirmed: the attachment whose gate
// granted it (nil: TCPConfig.Authorize's alone), and its notification.
type awaited struct {
	notif []byte
	att   *attachment
}

// brokeAll hands the READs served on this connection whose done never
// came to the attachments that granted them, as the connection closes:
// none can complete now (the consumer lands a READ only once its done is
// written, and nothing more comes on this connection), and every byte
// served is out of the region (the hold of each ended after its write).
// The attachments that took any are noted, for their hooks.
func (v *server) brokeAll() {
	for id, w := range v.awaiting {
		if w.att != nil && w.att.broke(v.s.agent, w.notif) {
			v.note(w.att)
		}
		delete(v.awaiting, id)
	}
}

// queue queues a notification for a's session. When the connection's
// share, or the queue, is full it waits for a drain, reading nothing meanwhile; false:
// none made room within IOTimeout (a consumer flooding us, or a producer
// that stopped stepping), and this connection is cut off.
func (v *server) queue(msg []byte, a *attachment) bool {
	for !v.d.queueNotif(v.s, a, msg) {
		v.note(a)
		v.flush() // the producer must hear of what waits
		if !v.s.awaitDrain(v.d.cfg.IOTimeout) {
			select {
			case <-v.s.gone: // closed: not for its notifications
			default:
				v.d.notifCuts.Add(1)
			}
			return false
		}
	}
	v.note(a)
	return true
}

// awaitDrain waits until a drain takes some of s's notifications; false:
// none did within timeout, or s closed.
func (s *servedConn) awaitDrain(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-s.drained:
		return true
	case <-t.C:
	case <-s.gone:
	}
	return false
}

// queueNotif queues a notification s brought for a (see route), for its
// session's drain; false: s's share of the queue, or the queue
// (maxNotifBytes), is full. One for an attachment detached meanwhile is
// dropped: its session ended its grants.
func (d *TCPData) queueNotif(s *servedConn, a *attachment, msg []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a != nil && a.detached.Load() {
		return true
	}
	cost := len(msg) + notifCost
	if s.queued+cost > connNotifBytes {
		s.full = true
		return false
	}
	if d.notifBytes+cost > d.notifCap {
		s.waitsAll, d.waitAll = true, true
		return false
	}
	s.queued += cost
	d.notifBytes += cost
	d.notifs = append(d.notifs, xfer.Notif{Agent: s.agent, Msg: msg})
	d.notifFrom = append(d.notifFrom, s)
	d.notifAtt = append(d.notifAtt, a)
	return true
}

// takeNotifsLocked appends to dst the queued notifications for the
// attachments mine picks (drop: forgets them instead), giving back their
// connections' shares and waking those that wait for room; the others
// stay queued, in order. Under d.mu.
func (d *TCPData) takeNotifsLocked(dst []xfer.Notif, mine func(*attachment) bool, drop bool) []xfer.Notif {
	k, before := 0, d.notifBytes
	for i, n := range d.notifs {
		if !mine(d.notifAtt[i]) {
			d.notifs[k], d.notifFrom[k], d.notifAtt[k] = n, d.notifFrom[i], d.notifAtt[i]
			k++
			continue
		}
		if !drop {
			dst = append(dst, n)
		}
		s := d.notifFrom[i]
		s.queued -= len(n.Msg) + notifCost
		d.notifBytes -= len(n.Msg) + notifCost
		if s.full {
			s.full = false
			s.wakeDrained()
		}
	}
	clear(d.notifs[k:])
	clear(d.notifFrom[k:])
	clear(d.notifAtt[k:])
	if k == 0 && cap(d.notifs) > 1024 {
		d.notifs, d.notifFrom, d.notifAtt = nil, nil, nil // a burst's queue goes with it
	} else {
		d.notifs, d.notifFrom, d.notifAtt = d.notifs[:k], d.notifFrom[:k], d.notifAtt[:k]
	}
	if d.waitAll && d.notifBytes < before {
		d.waitAll = false
		for s := range d.served {
			if s.waitsAll {
				s.waitsAll = false
				s.wakeDrained()
			}
		}
	}
	return dst
}

// wakeDrained wakes s, if it waits for room in the queue.
func (s *servedConn) wakeDrained() {
	select {
	case s.drained <- struct{}{}:
	default:
	}
}

// route says which attachment a notification s brought (with no READ:
// a copy off the board, a push landed, a grant given back) is for, and
// whether it goes on at all. One that presents a grant's token (a Go
// consumer's) goes to the live attachment whose gate holds that grant live
// for s's agent, and proves s (see prove); with one attachment live, and s
// proven under it, that one is not asked. Unless s holds a live proof
// under a live attachment (or TCPConfig.Authorize's), one that names no
// live grant, tokenless ones included, is dropped, and counted, here: a
// peer with no grant costs the sessions nothing, and a detached session's
// grants bring its successor nothing. The rest go to the current
// attachment, within s's share of the queue, and its session counts what
// it does not know.
func (d *TCPData) route(s *servedConn, msg []byte) (*attachment, bool) {
	live := d.liveList()
	under := s.under.Load()
	proven := d.proven(s) && (under == nil || !under.detached.Load())
	if len(live) == 0 {
		switch {
		case d.everAttached.Load():
			// Between sessions: the grants it could name ended with the
			// last one, and the next has none of them.
		case proven:
			return nil, true
		case d.cfg.Authorize != nil:
			// TCPConfig.Authorize alone: it says whether msg names a
			// grant it serves.
			if release, ok := d.cfg.Authorize(s.agent, msg, nil); ok {
				release()
				return nil, true
			}
		}
		d.notifDrops.Add(1)
		return nil, false
	}
	current := live[len(live)-1]
	if len(live) == 1 && proven && under == current {
		return current, true
	}
	if _, _, _, ok := wirext.SplitNotifGrant(msg); ok {
		for i := len(live) - 1; i >= 0; i-- {
			if h, ok := live[i].gate.Authorize(s.agent, msg, nil); ok {
				h.Release()
				d.prove(s, live[i], msg, leftOf(h, live[i]))
				return live[i], true
			}
		}
	}
	if proven {
		return current, true
	}
	d.notifDrops.Add(1)
	return nil, false
}

// read takes a READ frame (its head read) and answers it.
func (v *server) read() bool {
	d := v.d
	if _, err := io.ReadFull(v.r, v.buf[:14]); err != nil {
		return false
	}
	id := binary.BigEndian.Uint64(v.buf[:8])
	nl := int(binary.BigEndian.Uint16(v.buf[8:]))
	resend := nl&readResend != 0
	nl &^= readResend
	nb := int(binary.BigEndian.Uint32(v.buf[10:]))
	if nl > maxNotifLen || nb > d.region.Blocks() || len(v.awaiting) >= d.cfg.MaxQueued {
		return false
	}
	if _, dup := v.awaiting[id]; dup {
		return false // an id in flight again: its notification would be ambiguous
	}
	if _, err := io.ReadFull(v.r, v.notif[:nl]); err != nil {
		return false
	}
	var ok bool
	if v.ids, ok = readIDs(v.r, v.ids[:0], nb, d.region.Blocks(), v.scratch); !ok {
		return false
	}
	hold, a, ok := d.authorize(v.s.agent, v.notif[:nl], v.ids)
	if !ok {
		v.head = appendDataHead(v.head[:0], id, dataRefused, 0)
		return v.write(net.Buffers{v.head}) == nil
	}
	d.prove(v.s, a, v.notif[:nl], leftOf(hold, a))
	var by time.Time // when the grant's time is up
	if hold.Left > 0 {
		by = time.Now().Add(hold.Left + answerGrace)
	}
	if a != nil {
		a.bind(v.s, hold.Consumer)
	}
	v.awaiting[id] = awaited{bytes.Clone(v.notif[:nl]), a}
	if v.s.room > 0 && !resend && v.s.wasPushed(v.notif[:nl], v.ids) {
		// Its bytes went ahead on this connection: they are the
		// consumer's already.
		hold.Release()
		v.head = appendDataHead(v.head[:0], id, dataPushed, 0)
		return v.write(net.Buffers{v.head}) == nil
	}
	v.head = appendDataHead(v.head[:0], id, dataOK, uint64(nb)*uint64(d.region.BlockSize()))
	v.out = append(v.out[:0], v.head)
	v.runs = spans(v.runs[:0], v.ids)
	for _, r := range v.runs {
		v.out = append(v.out, d.region.Span(r[0], r[1]))
	}
	err := v.writeBy(v.out, by)
	if errors.Is(err, errGrantTime) {
		d.answersCut.Add(1)
	}
	hold.Release() // the bytes are out of the region (or never will be)
	return err == nil
}

// write writes bufs under the connection's write lock (pushes take turns
// with answers), failing when no byte moved for IOTimeout.
func (v *server) write(bufs net.Buffers) error { return v.writeBy(bufs, time.Time{}) }

// errGrantTime fails an answer still being written when its grant's time
// is up.
var errGrantTime = errors.New("transport: the grant's time is up with its answer unwritten")

// writeBy is write that also fails at by, if set, however the bytes move:
// a consumer that reads slowly holds the grant's entry no longer.
func (v *server) writeBy(bufs net.Buffers, by time.Time) error {
	v.s.wmu.Lock()
	defer v.s.wmu.Unlock()
	return writeBy(v.s.c, bufs, v.d.cfg.IOTimeout, by)
}

// authorize asks the gates: TCPConfig.Authorize's, if set, and the
// attached sessions', the current one first, until one grants; with
// neither nothing is served. a is the attachment that granted: what the
// READ brings is its.
func (d *TCPData) authorize(agent string, notif []byte, ids []int) (h plane.Hold, a *attachment, ok bool) {
	var user func()
	if f := d.cfg.Authorize; f != nil {
		if user, ok = f(agent, notif, ids); !ok {
			return h, nil, false
		}
		if user == nil {
			user = func() {}
		}
	}
	live := d.liveList()
	if len(live) == 0 {
		return plane.Hold{Release: user}, nil, user != nil
	}
	ok = false
	for i := len(live) - 1; i >= 0 && !ok; i-- {
		a = live[i]
		h, ok = a.gate.Authorize(agent, notif, ids)
	}
	if !ok {
		if user != nil {
			user()
		}
		return h, nil, false
	}
	if user != nil {
		session := h.Release
		h.Release = func() { user(); session() }
	}
	return h, a, true
}

// notified runs the hook of a's session (nil: the current one's), where
// its notifications were queued, or signals Ready.
func (d *TCPData) notified(a *attachment) {
	if a == nil {
		a = d.att.Load()
	}
	if a != nil {
		if f := a.hook.Load(); f != nil && (*f)() {
			return
		}
		d.owe(a)
	}
	d.notify()
}

// owe notes that a's notifications wait with no hook that took them, when
// others are live: another waiter of Ready may take the signal meant for
// a's session, and its drain then signals again (attachment.DrainNotifs).
func (d *TCPData) owe(a *attachment) {
	if a == nil || len(d.liveList()) < 2 {
		return
	}
	d.mu.Lock()
	a.owed = true
	d.mu.Unlock()
}
