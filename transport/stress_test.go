package transport

import (
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/plane"
	"github.com/ecxfer/ecxfer/internal/wirext"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// TestStress drives the real TCP data plane, over the socket, pushes and
// the same-host copy, with random READs of random sizes and, at random,
// connections broken on either side, producers removed and registered
// again, producer sessions replaced on the same plane, grants ended and
// their blocks rewritten, pushes, and READs released at any point. It
// checks the promise after every step and at the end:
//   - a READ that completed holds exactly its grant's bytes;
//   - no block is written after Release of its READ returned (a canary is
//     written into every block the moment it is handed back);
//   - every hold the producer gave is given back once, every READ ends.
//
// Each seed replays exactly as far as the random choices go (goroutines
// interleave as they will). 8 seeds run by default, 40 with ECXFER_LONG=1
// (unless -short or under the race detector); ECXFER_STRESS_SEEDS sets how
// many run (CI runs 1,000), ECXFER_STRESS_FIRST the first of them, and
// ECXFER_STRESS_SEED runs one.
func TestStress(t *testing.T) {
	stressSeeds(t, "TestStress$", stress)
	if stressTotals.completed == 0 {
		t.Fatal("no READ completed in any seed")
	}
}

// stressSeeds runs run for each seed the environment asks for (see
// TestStress) and returns how many ran.
func stressSeeds(t *testing.T, pattern string, run func(t *testing.T, seed uint64)) int {
	seeds := 8
	if os.Getenv("ECXFER_LONG") == "1" && !raceEnabled && !testing.Short() {
		seeds = 40
	}
	if s := os.Getenv("ECXFER_STRESS_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		seeds = n
	}
	first := uint64(1)
	if s := os.Getenv("ECXFER_STRESS_FIRST"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		first = n
	}
	if s := os.Getenv("ECXFER_STRESS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		first, seeds = n, 1
	}
	for seed := first; seed < first+uint64(seeds); seed++ {
		if !t.Run(fmt.Sprint(seed), func(t *testing.T) { run(t, seed) }) {
			t.Fatalf("seed %d failed: ECXFER_STRESS_SEED=%d go test -run '%s' ./transport", seed, seed, pattern)
		}
	}
	return seeds
}

// stressTotals adds up what the seeds did.
var stressTotals struct {
	sync.Mutex
	completed int
}

const (
	stressBS      = 16 << 10
	stressPBlocks = 256 // the producer's region: 4 MiB
	stressCBlocks = 512
	stressSteps   = 250
)

// stressGate is a producer session: grants of free blocks, whose bytes it
// writes as it grants (the grant's id in every word); a grant ended is
// retired from the board first, and its blocks are rewritten (reused) as
// soon as no READ holds them.
type stressGate struct {
	t      *testing.T
	att    plane.Attachment
	region *cache.Region
	mu     sync.Mutex
	grants map[uint64]*sgrant
	owner  []uint64      // per producer block: the grant whose bytes it holds, 0 when free
	holds  int           // given and not given back
	left   time.Duration // what a hold says its grant has left (plane.Hold.Left)
}

type sgrant struct {
	id     uint64
	token  wire.Token
	blocks []int
	notif  []byte
	live   bool
	holds  int
}

func fillBlock(b []byte, grant uint64, block int) {
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], grant<<20|uint64(block)<<8|uint64(i>>3&0xff))
	}
}

func holdsBlock(b []byte, grant uint64, block int) bool {
	for i := 0; i < len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != grant<<20|uint64(block)<<8|uint64(i>>3&0xff) {
			return false
		}
	}
	return true
}

// grant makes a grant of n free blocks, or nil if there are not enough.
func (g *stressGate) grant(rng *rand.Rand, n int) *sgrant {
	g.mu.Lock()
	defer g.mu.Unlock()
	var free []int
	for b, o := range g.owner {
		if o == 0 {
			free = append(free, b)
		}
	}
	if len(free) < n {
		return nil
	}
	rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	blocks := free[:n]
	if rng.IntN(2) == 0 {
		slices.Sort(blocks) // runs, as a cache's allocations mostly are
	}
	gr := &sgrant{id: testGrantIDs.Add(1), blocks: slices.Clone(blocks), live: true}
	for i := range gr.token {
		gr.token[i] = byte(rng.Uint32() | 1)
	}
	for _, b := range gr.blocks {
		g.owner[b] = gr.id
		fillBlock(g.region.Block(b), gr.id, b)
	}
	gr.notif = wirext.AppendNotifGrant([]byte("00000000-0000-4000-8000-000000000001:h"), gr.id, gr.token)
	g.grants[gr.id] = gr
	g.att.Publish(gr.id) // before the "ack"
	return gr
}

// end ends a grant: retired first, its blocks rewritten once no READ holds
// them.
func (g *stressGate) end(gr *sgrant) {
	g.att.Retire(gr.id)
	g.mu.Lock()
	defer g.mu.Unlock()
	if !gr.live {
		return
	}
	gr.live = false
	if gr.holds == 0 {
		g.reuseLocked(gr)
	}
}

// reuseLocked frees an ended grant's blocks, overwriting them as the next
// entry would.
func (g *stressGate) reuseLocked(gr *sgrant) {
	for _, b := range gr.blocks {
		if g.owner[b] == gr.id {
			g.owner[b] = 0
			fillBlock(g.region.Block(b), 0xdead, b)
		}
	}
	delete(g.grants, gr.id)
}

func (g *stressGate) Authorize(_ string, notif []byte, blocks []int) (plane.Hold, bool) {
	_, id, tok, ok := wirext.SplitNotifGrant(notif)
	g.mu.Lock()
	defer g.mu.Unlock()
	gr := g.grants[id]
	if !ok || gr == nil || !gr.live || subtle.ConstantTimeCompare(tok[:], gr.token[:]) != 1 {
		return plane.Hold{}, false
	}
	for _, b := range blocks {
		if !slices.Contains(gr.blocks, b) {
			return plane.Hold{}, false
		}
	}
	return plane.Hold{Release: g.hold(gr), Consumer: 1, Left: g.left}, true
}

// hold takes a hold on gr (under mu) and returns its release.
func (g *stressGate) hold(gr *sgrant) func() {
	gr.holds++
	g.holds++
	var once sync.Once
	return func() {
		released := false
		once.Do(func() {
			released = true
			g.mu.Lock()
			defer g.mu.Unlock()
			gr.holds--
			g.holds--
			if gr.holds == 0 && !gr.live {
				g.reuseLocked(gr)
			}
		})
		if !released {
			g.t.Error("a hold was released twice")
		}
	}
}

// push pushes gr to consumer session 1, if the plane takes it.
func (g *stressGate) push(gr *sgrant) {
	g.mu.Lock()
	if !gr.live {
		g.mu.Unlock()
		return
	}
	release := g.hold(gr)
	g.mu.Unlock()
	if !g.att.Push(1, gr.notif, gr.blocks, release) {
		release()
	}
}

// stressRead is a READ the consumer posted.
type stressRead struct {
	h      xfer.Handle
	gr     *sgrant
	local  []int
	remote []int
}

type stressRun struct {
	t      *testing.T
	rng    *rand.Rand
	c, p   *TCPData
	cr     *cache.Region
	gate   *stressGate
	agent  string
	free   []int // consumer blocks handed back, holding the canary
	reads  []*stressRead
	grants []*sgrant
	shared bool
	stats  [4]int // completed, failed, released in flight, landed without asking
}

const canary = 0xa5

func stress(t *testing.T, seed uint64) {
	r := newStressRun(t, seed, TCPConfig{Listen: "127.0.0.1:0", IOTimeout: 5 * time.Second}, 0)
	for step := range stressSteps {
		r.step(step)
		r.collect(false)
	}
	r.finish()
}

// newStressRun sets up a seed's run: a producer configured by pcfg, whose
// holds say their grant has left left, and a consumer that registered it.
func newStressRun(t *testing.T, seed uint64, pcfg TCPConfig, left time.Duration) *stressRun {
	rng := rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15))
	r := &stressRun{t: t, rng: rng, shared: rng.IntN(2) == 0}
	var pr *cache.Region
	if r.shared {
		pr = newSharedRegion(t, stressPBlocks, stressBS)
	} else {
		pr = newRegion(t, stressPBlocks, stressBS)
	}
	r.cr = newRegion(t, stressCBlocks, stressBS)
	for i := range r.cr.Bytes() {
		r.cr.Bytes()[i] = canary
	}
	for b := range stressCBlocks {
		r.free = append(r.free, b)
	}
	r.p = newTCP(t, pr, pcfg)
	r.gate = &stressGate{t: t, region: pr, grants: map[uint64]*sgrant{}, owner: make([]uint64, stressPBlocks), left: left}
	r.gate.att = r.p.attach(r.gate)
	ccfg := TCPConfig{IOTimeout: 5 * time.Second, Conns: 1 + rng.IntN(2), CopyWorkers: 1 + rng.IntN(3)}
	if rng.IntN(4) == 0 {
		ccfg.PushBuffer = -1
	}
	r.c = newTCP(t, r.cr, ccfg)
	r.register()
	return r
}

func (r *stressRun) register() {
	peer, err := r.c.AddRemotePeer(r.p.AgentMetadata(), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.agent = peer.Agent
}

// step takes one random action.
func (r *stressRun) step(step int) {
	switch x := r.rng.IntN(100); {
	case x < 30:
		if len(r.grants) > 0 && r.rng.IntN(8) != 0 {
			r.post(r.grants[r.rng.IntN(len(r.grants))], r.rng.IntN(4) == 0)
		} else if gr := r.newGrant(); gr != nil {
			r.post(gr, false)
		}
	case x < 50:
		// A grant, pushed as its ack leaves, and its READ posted as the
		// ack arrives: before, while or after its push lands.
		if gr := r.newGrant(); gr != nil {
			r.gate.push(gr)
			if r.rng.IntN(3) != 0 {
				if r.rng.IntN(2) == 0 {
					time.Sleep(time.Duration(r.rng.IntN(200)) * time.Microsecond)
				}
				r.post(gr, false)
			}
		}
	case x < 60:
		if len(r.grants) > 0 {
			i := r.rng.IntN(len(r.grants))
			r.gate.end(r.grants[i])
			r.grants = slices.Delete(r.grants, i, i+1)
		}
	case x < 68:
		if len(r.reads) > 0 {
			r.release(r.rng.IntN(len(r.reads)), true)
		}
	case x < 72:
		r.breakConsumerLink()
	case x < 75:
		r.closeServedConn()
	case x < 77:
		// The producer removed and registered again (a restart as the
		// consumer sees it): READs in flight to it fail.
		r.c.RemoveRemotePeer(r.agent)
		r.register()
	case x < 78:
		// The producer session replaced on the same plane: its grants all
		// end with it.
		old := r.gate.att
		old.Detach()
		for _, gr := range r.grants {
			r.gate.end(gr)
		}
		r.grants = nil
		r.gate.att = r.p.attach(r.gate)
		old.Publish(1 << 40) // a detached session acts on nothing
	default:
		time.Sleep(time.Duration(r.rng.IntN(300)) * time.Microsecond)
	}
	if step%16 == 0 {
		runtime.Gosched()
	}
}

func (r *stressRun) newGrant() *sgrant {
	n := 1 + r.rng.IntN(8)
	switch r.rng.IntN(20) {
	case 0:
		n = 2*parallelCopyMin/stressBS + r.rng.IntN(16) // copied by several goroutines
	case 1, 2:
		n = 16 + r.rng.IntN(32)
	}
	gr := r.gate.grant(r.rng, n)
	if gr != nil {
		r.grants = append(r.grants, gr)
	}
	return gr
}

// post posts a READ of a grant's blocks, or of some of them (partial:
// never pushed), into free blocks; now and then under a grant that ended:
// it must fail, or land the bytes it had.
func (r *stressRun) post(gr *sgrant, partial bool) {
	if len(gr.blocks) > len(r.free) {
		return
	}
	remote := gr.blocks
	if partial && len(remote) > 1 {
		remote = remote[:1+r.rng.IntN(len(remote)-1)]
	}
	r.rng.Shuffle(len(r.free), func(i, j int) { r.free[i], r.free[j] = r.free[j], r.free[i] })
	local := slices.Clone(r.free[:len(remote)])
	for _, b := range local {
		r.checkCanary(b, "before its READ was posted")
	}
	h, err := r.c.PostRead(local, r.agent, remote, gr.notif)
	if err != nil {
		return // busy, or the peer went: the blocks stay free
	}
	r.free = r.free[len(remote):]
	r.reads = append(r.reads, &stressRead{h: h, gr: gr, local: local, remote: slices.Clone(remote)})
}

func (r *stressRun) checkCanary(b int, when string) {
	for i, v := range r.cr.Block(b) {
		if v != canary {
			r.t.Fatalf("block %d byte %d written %s", b, i, when)
		}
	}
}

// release releases READ i and hands its blocks back, with the canary.
func (r *stressRun) release(i int, inFlight bool) {
	rd := r.reads[i]
	if err := r.c.Release(rd.h); err != nil {
		r.t.Fatalf("Release: %v", err)
	}
	if inFlight {
		r.stats[2]++
	}
	for _, b := range rd.local {
		blk := r.cr.Block(b)
		for j := range blk {
			blk[j] = canary
		}
	}
	r.free = append(r.free, rd.local...)
	r.reads = slices.Delete(r.reads, i, i+1)
}

// collect checks the READs that ended; wait: until every READ ended.
func (r *stressRun) collect(wait bool) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		for i := 0; i < len(r.reads); {
			rd := r.reads[i]
			p, err := r.c.Check(rd.h)
			if err != nil {
				r.t.Fatal(err)
			}
			if p == xfer.InProgress {
				i++
				continue
			}
			if p == xfer.Complete {
				r.stats[0]++
				for k, b := range rd.local {
					if !holdsBlock(r.cr.Block(b), rd.gr.id, rd.remote[k]) {
						r.t.Fatalf("a completed READ under grant %d: local block %d does not hold remote block %d's bytes", rd.gr.id, b, rd.remote[k])
					}
				}
			} else {
				r.stats[1]++
			}
			r.release(i, false)
		}
		if !wait || len(r.reads) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d READs did not end within 30 s", len(r.reads))
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (r *stressRun) breakConsumerLink() {
	r.c.mu.Lock()
	pe := r.c.peers[r.agent]
	r.c.mu.Unlock()
	if pe == nil {
		return
	}
	l := pe.links[r.rng.IntN(len(pe.links))]
	l.mu.Lock()
	conn := l.conn
	l.mu.Unlock()
	if conn != nil {
		l.breakIf(conn, errReleased)
	}
}

func (r *stressRun) closeServedConn() {
	r.p.mu.Lock()
	var conns []*servedConn
	for s := range r.p.served {
		conns = append(conns, s)
	}
	r.p.mu.Unlock()
	if len(conns) > 0 {
		slices.SortFunc(conns, func(a, b *servedConn) int { return compareConn(a, b) })
		conns[r.rng.IntN(len(conns))].c.Close()
	}
}

func compareConn(a, b *servedConn) int {
	return compareStr(a.c.RemoteAddr().String(), b.c.RemoteAddr().String())
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// finish lets every READ end, ends every grant, closes both planes and
// checks what the whole run must leave.
func (r *stressRun) finish() {
	r.collect(true)
	for _, gr := range r.grants {
		r.gate.end(gr)
	}
	r.c.Close()
	for b := range stressCBlocks {
		r.checkCanary(b, "after its READ was released")
	}
	r.p.Close()
	r.gate.mu.Lock()
	holds := r.gate.holds
	r.gate.mu.Unlock()
	if holds != 0 {
		r.t.Fatalf("%d holds never given back", holds)
	}
	stressTotals.Lock()
	stressTotals.completed += r.stats[0]
	stressTotals.Unlock()
	r.stats[3] = int(r.c.Stats().BoardCopies + r.c.Stats().Pushed)
	r.t.Logf("shared %v: completed %d, failed %d, released in flight %d, landed unasked %d", r.shared, r.stats[0], r.stats[1], r.stats[2], r.stats[3])
}
