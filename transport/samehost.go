package transport

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/internal/shm"
)

// The same-host path. A producer whose region is Shared (a sealed memfd)
// names its file in the metadata; a consumer on the same host that can
// open it (same user, same PID namespace) maps it read-only. The file's
// header holds a random token, a secret among the producer and the
// processes that can read its memory, and the producer's table of live
// grants: a slot per grant id modulo the slots, holding the id while the
// grant is live. The producer session writes a grant there before its ack
// leaves and clears it before the grant's pin goes.
//
// Nothing is revealed before the producer proves itself: a consumer that
// mapped a region sends a random challenge in its hello, and uses the
// region for that producer only once the welcome answers with
// HMAC-SHA256(token, challenge, address, incarnation), which only the
// region's owner can compute, naming the address the consumer dialed and
// the incarnation its metadata gave. Metadata from another host that names
// a local producer's region thus gets a consumer to do nothing but read
// over TCP, and so does a relay at another address that passes the
// challenge on to the local producer: the owner's answer names its own
// address, not the relay's.
//
// Once proven, a READ whose grant the table shows live is copied out of the
// mapping without a READ frame: one memcpy instead of two kernel copies
// and a round trip. Grants only end, and grant ids never repeat within a
// producer process, so a grant the table still shows after the copy was
// live throughout, and the bytes are the entry's; one gone fails the READ
// (only that READ). The consumer then sends the notification, with the
// grant's token, which the producer's session checks as any other. That
// relies on loads not passing older loads, so it is done on amd64 only
// (checkAfterCopy); elsewhere, and for grants the table does not show
// (a slot taken by another grant, a producer with a gate of the user's),
// READs go over the socket.
//
// What it trusts: a process of the producer's user on its host can open
// the file and read any block, granted or not (as any agent with a
// producer's NIXL metadata can). The file is not in any directory, is
// opened through /proc (which the kernel limits to the same user, or
// root), and dies with the producer.

// tokenLen is the size of the token at the start of a Shared region's
// header; grantTabOff is where its grant table starts, running to the end
// of the header.
const (
	tokenLen    = 32
	grantTabOff = 4096
)

// checkAfterCopy says a copy's loads are done before a later load of the
// grant table is: so on amd64, where loads are not reordered with older
// loads. Elsewhere a consumer sends every READ over the socket (the Go
// memory model offers no read fence to put between them).
const checkAfterCopy = runtime.GOARCH == "amd64"

// sharedPeer is a producer's region, mapped by a consumer.
type sharedPeer struct {
	mem       []byte // the file: header and blocks
	off       int    // where the blocks start
	table     []atomic.Uint64
	challenge [challengeLen]byte
	want      [proofLen]byte // the proof that answers it
	verified  atomic.Bool    // a welcome carried it
	proven    chan struct{}  // closed with verified
	populates bool           // our mapping is new: fault its pages in once proven
	fd        int            // the region file, for populate, which closes it
	populated chan struct{}  // closed once its pages are faulted in (or that gave up)
	unmap     func()
	copies    chan *readOp  // large READs, and bursts, for the copy goroutine
	offloaded atomic.Uint64 // READs handed to it, for tests
	queued    atomic.Int64  // READs handed to the copy goroutine whose notifications it has not sent
}

// proof is the welcome's answer to a challenge from the token's owner,
// bound to who answers: the address its metadata names, which the
// consumer dialed, and its incarnation. A relay that forwards the
// challenge to the region's owner at another address gets back a proof
// for that address, not its own.
func proof(token, challenge []byte, addr, inc string) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte("ecxfer same-host proof v2\x00"))
	m.Write(challenge)
	for _, s := range []string{addr, inc} {
		m.Write(binary.BigEndian.AppendUint32(nil, uint32(len(s))))
		m.Write([]byte(s))
	}
	return m.Sum(nil)
}

// welcomeProof is a producer's answer to a hello's challenge, bound to the
// address and incarnation of its own metadata (read there: a hello is
// once per connection). nil: it has no token.
func (d *TCPData) welcomeProof(challenge []byte) []byte {
	var m agentMeta
	if d.token == nil || msgpack.Unmarshal(d.meta, &m) != nil {
		return nil
	}
	return proof(d.token, challenge, m.Addr, m.Incarnation)
}

// verify takes a welcome's proof: the producer at the other end owns the
// region we mapped.
func (sh *sharedPeer) verify(got []byte) {
	if hmac.Equal(got, sh.want[:]) && sh.verified.CompareAndSwap(false, true) {
		close(sh.proven)
	}
}

// route says whether op is copied out of the region, and on which
// goroutine: a small READ that comes alone on the caller's (latency),
// large ones and bursts (a step that took many acks) on the copy
// goroutine, off the caller's loop. Called with d.mu.
func (sh *sharedPeer) route(op *readOp) int {
	if !checkAfterCopy || !sh.verified.Load() || len(sh.table) == 0 {
		return viaSocket
	}
	g := grantOf(op.notif)
	if g == 0 || sh.table[g%uint64(len(sh.table))].Load() != g {
		return viaSocket
	}
	now := monoNow()
	burst := now-op.peer.d.lastPost.Load() < int64(fastBurst)
	if op.n*op.peer.d.region.BlockSize() < copyOnCallerMax && !burst {
		return viaBoard
	}
	if len(sh.copies) == cap(sh.copies) {
		return viaSocket
	}
	sh.offloaded.Add(1)
	sh.queued.Add(1)
	return viaCopier
}

// copyOnCallerMax is the largest READ copied on the caller's goroutine.
const copyOnCallerMax = 256 << 10

// boardCopy copies op out of the producer's region under the grant its
// notification names, then checks that the grant is still live. The
// caller holds a readers reference. claimed: the caller is op's lander,
// and lands it (live: done, after its notification is on its way).
func (p *peer) boardCopy(op *readOp) (claimed, live bool) {
	if !op.claim(opQueued) {
		return false, false // released before the copy
	}
	if f := p.d.beforeCopy; f != nil {
		f()
	}
	p.copyShared(op)
	g := grantOf(op.notif)
	live = p.sh.table[g%uint64(len(p.sh.table))].Load() == g
	if live {
		p.d.boardCopies.Add(1)
	}
	return true, live
}

// copyShared copies op's blocks out of the producer's mapped region; a
// large READ on several goroutines at once.
func (p *peer) copyShared(op *readOp) {
	bs := p.d.region.BlockSize()
	src := p.sh.mem[p.sh.off:]
	var s []copySpan
	off := 0
	walk(op, bs, func(li, ri, n int) {
		dst := p.d.region.Span(li, n)
		s = append(s, copySpan{dst, src[ri*bs : (ri+n)*bs], off})
		off += len(dst)
	})
	parallelCopy(s, off, p.d.cfg.copyWorkers())
}

// walk calls f for op's runs that are contiguous on both sides, in order:
// local block li and remote block ri, n blocks.
func walk(op *readOp, _ int, f func(li, ri, n int)) {
	loc, rem := op.local, op.remote
	var lo, ro int // blocks of loc[0] and rem[0] already walked
	for len(loc) > 0 && len(rem) > 0 {
		n := min(loc[0][1]-lo, rem[0][1]-ro)
		f(loc[0][0]+lo, rem[0][0]+ro, n)
		if lo += n; lo == loc[0][1] {
			loc, lo = loc[1:], 0
		}
		if ro += n; ro == rem[0][1] {
			rem, ro = rem[1:], 0
		}
	}
}

// startShared starts the goroutines of a mapped region: the copy
// goroutine, and the one that faults its pages in.
func (p *peer) startShared() {
	p.sh.copies = make(chan *readOp, p.d.cfg.MaxQueued)
	p.sh.populated = make(chan struct{})
	if !p.sh.populates {
		close(p.sh.populated)
	} else {
		p.readers.Add(1)
		p.d.wg.Add(1)
		go p.populate()
	}
	p.readers.Add(1)
	p.d.wg.Add(1)
	go p.copier()
}

// copier copies large READs, and bursts, under published grants, and sends
// their notifications once a burst is copied, in one write.
func (p *peer) copier() {
	defer p.d.wg.Done()
	defer p.readers.Done()
	var done [][]byte
	taken := int64(0) // READs taken whose notifications are not sent yet (queued)
	for {
		select {
		case <-p.stop:
			if len(done) > 0 { // landed: their notifications go as the writers' would
				p.sendNotes(done)
			}
			p.sh.queued.Add(-taken)
			for {
				select {
				case op := <-p.sh.copies:
					op.fail(errStopped)
					p.sh.queued.Add(-1)
					p.readers.Done()
				default:
					return
				}
			}
		case op := <-p.sh.copies:
			// A burst's notifications go in one write, once it is copied.
			if claimed, live := p.boardCopy(op); claimed {
				op.land(grantLive(live))
				if live {
					done = append(done, op.notif)
				}
			}
			taken++
			p.readers.Done()
		}
		if len(p.sh.copies) == 0 || len(done) == 64 {
			if len(done) > 0 {
				p.sendNotes(done)
				clear(done)
				done = done[:0]
			}
			p.sh.queued.Add(-taken)
			taken = 0
		}
	}
}

// populate maps the pages of the producer's region into our page tables
// ahead of the copies, off the step loop: a first touch costs a page fault
// per 4 KiB page (about 3 µs each on the development VM, more than the
// copy). A read fault on a file hole allocates the page, charged to us,
// so it waits for the producer's proof that the region is its own, and
// populates only the file's data, not its holes: an unproven peer could
// otherwise make us allocate a region's worth of memory. It stops at the
// peer's shutdown; kernels before 5.14 lack MADV_POPULATE_READ, and then
// the copies fault the pages in.
func (p *peer) populate() {
	defer p.d.wg.Done()
	defer p.readers.Done()
	defer close(p.sh.populated)
	defer unix.Close(p.sh.fd)
	select {
	case <-p.sh.proven:
	case <-p.stop:
		return
	}
	const chunk = 16 << 20
	dataExtents(p.sh.fd, len(p.sh.mem), func(lo, hi int) bool {
		for off := lo; off < hi; off += chunk {
			if p.stopped() || shm.PopulateRead(p.sh.mem[off:min(off+chunk, hi)]) != nil {
				return false
			}
		}
		return true
	})
}

// borrowOwn lets a consumer read a producer region of its own process
// through the producer's mapping. Tests turn it off to exercise the
// mapping of another process's region.
var borrowOwn = true

// regionKey names a producer's region file (its inode).
type regionKey struct{ dev, ino uint64 }

// regionMap is a producer's region mapped by this data plane, shared by its
// peers of that producer (registrations of one producer come and go).
type regionMap struct {
	mem  []byte
	refs int
}

// mapShared maps the producer's Shared region the metadata names,
// read-only, and prepares the challenge its welcome must answer. Called
// with d.mu.
func (d *TCPData) mapShared(m agentMeta) (*sharedPeer, error) {
	var pid, fd int
	if n, err := fmt.Sscanf(m.Shm, "/proc/%d/fd/%d", &pid, &fd); n != 2 || err != nil ||
		m.Shm != fmt.Sprintf("/proc/%d/fd/%d", pid, fd) || m.ShmOff < grantTabOff || m.ShmOff%8 != 0 ||
		m.Grants < 0 || m.Grants > (m.ShmOff-grantTabOff)/8 {
		return nil, fmt.Errorf("%w: shared region %q at %d", errBadMeta, m.Shm, m.ShmOff)
	}
	f, err := openRegionFile(m.Shm)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	need := int64(m.ShmOff) + int64(m.Blocks)*int64(m.BlockSize)
	if st.Size < need || st.Size > need+int64(os.Getpagesize()) {
		return nil, fmt.Errorf("%w: shared region of %d bytes, want %d", errBadMeta, st.Size, need)
	}
	sh := &sharedPeer{off: m.ShmOff, proven: make(chan struct{})}
	key := regionKey{uint64(st.Dev), st.Ino}
	skey := shm.Key{Dev: key.dev, Ino: key.ino}
	// undo releases the mapping on the way out with an error: we hold d.mu.
	var undo func()
	if mem, ok := shm.Borrow(skey); ok && borrowOwn && len(mem) == int(st.Size) {
		// Our own process's region: read it through its mapping, whose
		// pages are in the page tables already.
		sh.mem = mem
		sh.unmap = func() {
			if shm.Return(skey, mem) {
				unix.Munmap(mem)
			}
		}
		undo = sh.unmap
	} else {
		if ok {
			if shm.Return(skey, mem) {
				unix.Munmap(mem)
			}
		}
		if sh.mem, sh.populates, err = d.mapRegion(f, key, int(st.Size)); err != nil {
			return nil, err
		}
		sh.unmap = func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.unmapRegionLocked(sh.mem, key)
		}
		undo = func() { d.unmapRegionLocked(sh.mem, key) }
	}
	if m.Grants > 0 {
		sh.table = unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&sh.mem[grantTabOff])), m.Grants)
	}
	if _, err := rand.Read(sh.challenge[:]); err != nil {
		undo()
		return nil, err
	}
	// The token is read with pread, not through the mapping: before the
	// proof nothing of the file may cost us memory, and a read fault on a
	// hole would allocate a page (a huge one where shared memory has them).
	var token [tokenLen]byte
	if n, err := readToken(int(f.Fd()), token[:]); n != tokenLen || err != nil {
		undo()
		return nil, fmt.Errorf("%w: shared region's token unreadable (%d bytes, %v)", errBadMeta, n, err)
	}
	// Only the owner listening at the address we dial, of the
	// incarnation named, answers this one.
	copy(sh.want[:], proof(token[:], sh.challenge[:], m.Addr, m.Incarnation))
	if sh.populates {
		// Kept for populate, which faults in only what has pages.
		if sh.fd, err = unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0); err != nil {
			undo()
			return nil, err
		}
	}
	return sh, nil
}

// mapRegion maps f read-only, or takes another reference to this plane's
// mapping of it; new says the mapping is new. Called with d.mu.
func (d *TCPData) mapRegion(f *os.File, key regionKey, size int) (mem []byte, new bool, err error) {
	if r := d.maps[key]; r != nil && len(r.mem) == size {
		r.refs++
		return r.mem, false, nil
	}
	mem, err = unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, false, err
	}
	if d.maps[key] == nil { // else a stale size: keep that one's entry, map this privately
		d.maps[key] = &regionMap{mem: mem, refs: 1}
	}
	return mem, true, nil
}

// readToken reads a region's token from its file (tests make it fail).
var readToken = func(fd int, token []byte) (int, error) { return unix.Pread(fd, token, 0) }

// unmapRegionLocked drops a reference taken by mapRegion. Called with d.mu.
func (d *TCPData) unmapRegionLocked(mem []byte, key regionKey) {
	if r := d.maps[key]; r != nil && unsafe.SliceData(r.mem) == unsafe.SliceData(mem) {
		if r.refs--; r.refs > 0 {
			return
		}
		delete(d.maps, key)
	}
	unix.Munmap(mem)
}
