//go:build nixl

package nixl

import (
	"go.uber.org/goleak"

	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/xfer"
)

// Two processes: the test binary runs itself as the producer (child mode
// in ECXFER_NIXL_CHILD), and the test is the consumer.

const (
	fetchBytes = 64 << 20 // per fetch
	childItems = 2        // entries the child serves
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func childFill(b []byte, item, block int) {
	for i := 0; i+8 <= len(b); i += 8 {
		x := uint64(item)<<48 ^ uint64(block)<<24 ^ uint64(i)*0x9e3779b97f4a7c15
		b[i], b[i+1], b[i+2], b[i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(x>>32), byte(x>>40), byte(x>>48), byte(x>>56)
	}
}

func compat(blockSize int) string { return fmt.Sprintf("nixl-twoproc-%d", blockSize) }

// TestMain runs the child when asked to.
func TestMain(m *testing.M) {
	if mode := os.Getenv("ECXFER_NIXL_CHILD"); mode != "" {
		if err := runChild(mode); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// runChild serves childItems entries of fetchBytes until stdin closes.
// Modes: "raw" (a NIXL agent expecting READs throughout; prints its
// metadata and descriptor), "session" (connector.Producer over NIXL), "tcp"
// (connector.Producer over the TCP data plane) and "shm" (the same over a
// Shared region: the consumer copies out of it); the last three print the
// control endpoint.
func runChild(mode string) error {
	var bs int
	fmt.Sscan(os.Getenv("ECXFER_NIXL_BLOCK"), &bs)
	if mode == "many" {
		return runManyChild(bs)
	}
	if mode == "absent" {
		if err := checkAbsent(); err != nil {
			return err
		}
		mode = "tcp"
	}
	per := fetchBytes / bs
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: childItems * per, BlockSize: bs, Shared: mode == "shm"})
	if err != nil {
		return err
	}
	defer region.Close()
	entries := cache.NewEmbeddingCache(region.Blocks())
	for i := range childItems {
		e, err := entries.Alloc(fmt.Sprint(i), per)
		if err != nil {
			return err
		}
		for j, b := range e.Blocks {
			childFill(region.Block(b), i, j)
		}
		entries.MarkReady(fmt.Sprint(i))
	}
	var data xfer.DataTransport
	var params map[string]string
	if p := os.Getenv("ECXFER_NIXL_PARAMS"); p != "" {
		k, v, _ := strings.Cut(p, "=")
		params = map[string]string{k: v}
	}
	if mode == "tcp" || mode == "shm" {
		data, err = transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0", Logger: quiet}, region)
	} else {
		data, err = New(Config{Name: fmt.Sprintf("child-%d", os.Getpid()), Params: params}, region)
	}
	if err != nil {
		return err
	}
	defer data.Close()
	stdin := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdin) }()
	if mode == "raw" {
		data.(*Agent).expectReads(1) // driven throughout, as under a live grant
		fmt.Printf("%s %s\n", hex.EncodeToString(data.AgentMetadata()), hex.EncodeToString(data.MemDescriptor()))
		<-stdin
		return nil
	}
	srv, err := transport.Listen("127.0.0.1:0", transport.ServerConfig{Logger: quiet})
	if err != nil {
		return err
	}
	defer srv.Close()
	// Two entries of half the cache each: the pinned share would make every
	// second fetch wait out a NOT_READY backoff. The benchmark measures the
	// data path.
	prod := must(connector.NewProducer(connector.ProducerConfig{CompatHash: compat(bs), MaxPinnedShare: 1, Logger: quiet}, srv, data, entries))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { prod.Serve(ctx); close(done) }()
	fmt.Println(srv.Endpoint())
	<-stdin
	cancel()
	<-done
	prod.Close()
	return nil
}

// checkAbsent is the "absent" child's first step: EnvLib names no file,
// so New must fail with ErrNotInstalled saying what is missing and what
// to set. The child then serves over TCP.
func checkAbsent() error {
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: 1, BlockSize: 4096})
	if err != nil {
		return err
	}
	defer r.Close()
	a, err := New(Config{Name: "absent"}, r)
	if err == nil {
		a.Close()
		return fmt.Errorf("New made an agent with %s=%s", EnvLib, os.Getenv(EnvLib))
	}
	if !errors.Is(err, ErrNotInstalled) || strings.Contains(err.Error(), "\n") {
		return fmt.Errorf("New: %v, want one line wrapping ErrNotInstalled", err)
	}
	for _, want := range []string{os.Getenv(EnvLib), "cannot open shared object file", EnvLib + "=", "libnixl_capi.so"} {
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("New: %q does not say %q", err, want)
		}
	}
	return nil
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	line  string
}

func startChild(tb testing.TB, mode string, bs int, v variant) *child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ECXFER_NIXL_CHILD="+mode, fmt.Sprint("ECXFER_NIXL_BLOCK=", bs))
	if v.tls != "" {
		cmd.Env = append(cmd.Env, "UCX_TLS="+v.tls)
	}
	for k, val := range v.params {
		cmd.Env = append(cmd.Env, "ECXFER_NIXL_PARAMS="+k+"="+val)
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: in}
	tb.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			tb.Errorf("child %s: %v", mode, err)
		}
	})
	line, err := bufio.NewReaderSize(out, 1<<22).ReadString('\n')
	if err != nil {
		tb.Fatalf("child %s said nothing: %v", mode, err)
	}
	c.line = strings.TrimSpace(line)
	return c
}

// fetcher fetches one entry of the child per call into the consumer's
// region and reports the blocks it landed in.
type fetcher interface {
	fetch(tb testing.TB, item int) []int
	region() *cache.Region
}

type rawFetcher struct {
	a      *Agent
	r      *cache.Region
	peer   xfer.Peer
	remote []int
	local  []int
}

func (f *rawFetcher) region() *cache.Region { return f.r }

func (f *rawFetcher) fetch(tb testing.TB, item int) []int {
	per := len(f.local)
	for i := range f.remote {
		f.remote[i] = item*per + i
	}
	h, err := f.a.PostRead(f.local, f.peer.Agent, f.remote, []byte("raw:"+fmt.Sprint(item)))
	if err != nil {
		tb.Fatal(err)
	}
	for {
		p, err := f.a.Check(h)
		if err != nil || p == xfer.Failed {
			tb.Fatalf("READ: %s %v", p, err)
		}
		if p == xfer.Complete {
			break
		}
	}
	f.a.Release(h)
	return f.local
}

type poolFetcher struct {
	pool   *connector.Pool
	r      *cache.Region
	addr   string
	blocks []int
}

func (f *poolFetcher) region() *cache.Region { return f.r }

func (f *poolFetcher) fetch(tb testing.TB, item int) []int {
	now := time.Now()
	if _, err := f.pool.Fetch(f.addr, fmt.Sprint(item), f.blocks, now.Add(30*time.Second), now); err != nil {
		tb.Fatal(err)
	}
	for {
		r := f.pool.Step(time.Now())
		if len(r.Failed) > 0 {
			tb.Fatalf("fetch %d failed: %+v", item, r.Failed[0])
		}
		if len(r.Completed) > 0 {
			return f.blocks
		}
		f.pool.Wait(context.Background()) // as an engine's loop: sleep until there is work
	}
}

func newFetcher(tb testing.TB, mode string, bs int, v variant) fetcher {
	tb.Helper()
	post := "auto"
	if m, ok := strings.CutPrefix(mode, "session-"); ok {
		mode, post = "session", m
	}
	if mode == "raw" {
		post = "sync" // NIXL's own: post and check in the caller
	}
	c := startChild(tb, mode, bs, v)
	per := fetchBytes / bs
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: per, BlockSize: bs})
	if err != nil {
		tb.Fatal(err)
	}
	blocks := make([]int, per)
	for i := range blocks {
		blocks[i] = i
	}
	var data xfer.DataTransport
	if mode == "tcp" || mode == "shm" || mode == "absent" {
		data, err = transport.NewTCPData(transport.TCPConfig{Logger: quiet}, r)
	} else {
		data, err = New(withPost(post, Config{Name: fmt.Sprintf("parent-%d-%d", os.Getpid(), seq.Add(1)), Params: v.params}), r)
	}
	if err != nil {
		r.Close()
		if t, ok := tb.(*testing.T); ok {
			needNIXL(t, err)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() { data.Close(); r.Close() })
	if mode == "raw" {
		md, _ := hex.DecodeString(strings.Fields(c.line)[0])
		desc, _ := hex.DecodeString(strings.Fields(c.line)[1])
		peer, err := data.AddRemotePeer(md, desc)
		if err != nil {
			tb.Fatal(err)
		}
		return &rawFetcher{a: data.(*Agent), r: r, peer: peer, remote: make([]int, per), local: blocks}
	}
	ctl := transport.NewClient(transport.ClientConfig{Logger: quiet})
	pool := must(connector.NewPool(connector.PoolConfig{CompatHash: compat(bs), BlockSize: bs, Logger: quiet}, ctl, data))
	tb.Cleanup(func() { pool.Close(); ctl.Close() })
	return &poolFetcher{pool: pool, r: r, addr: c.line, blocks: blocks}
}

func verify(tb testing.TB, r *cache.Region, blocks []int, item int) {
	want := make([]byte, r.BlockSize())
	for j, b := range blocks {
		childFill(want, item, j)
		if !bytes.Equal(r.Block(b), want) {
			tb.Fatalf("item %d block %d: bytes differ", item, j)
		}
	}
}

// A process of this binary where NIXL cannot be found: New fails saying
// so (checkAbsent), and the same process serves over the TCP data plane.
func TestNotInstalledServesTCP(t *testing.T) {
	t.Setenv(EnvLib, filepath.Join(t.TempDir(), "nowhere", "libnixl_capi.so")) // for the child
	f := newFetcher(t, "absent", 1<<20, variant{})
	for i := range childItems {
		clear(f.region().Bytes())
		verify(t, f.region(), f.fetch(t, i), i)
	}
}

// A producer process and this one: 64 MiB fetches through the sessions
// over NIXL, every byte verified, over each transport and block size.
func TestTwoProcessFetch(t *testing.T) {
	forVariants(t, func(t *testing.T, v variant) {
		for _, bs := range []int{8 << 10, 1 << 20} {
			for _, mode := range []string{"raw", "session"} {
				t.Run(fmt.Sprintf("%s-%dKiB", mode, bs>>10), func(t *testing.T) {
					f := newFetcher(t, mode, bs, v)
					for i := range 4 {
						clear(f.region().Bytes())
						blocks := f.fetch(t, i%childItems)
						verify(t, f.region(), blocks, i%childItems)
					}
				})
			}
		}
	})
}

// BenchmarkTwoProcess64MiB measures, in one run, a 64 MiB fetch between two
// processes: NIXL through Agent with the producer expecting READs
// throughout (raw), the same with the posting thread fresh from a sleep before each
// READ (raw-parked: a session's step loop has slept waiting for its ack),
// the same through connector.Pool and connector.Producer (session, whose
// 64 MiB READs the progress goroutine posts; and session-sync, the
// consumer's agent with Config.SyncPost), and the TCP
// data plane through the same (tcp-plane; shm-plane with the producer's
// region Shared, so the consumer copies out of it).
//
//	go test -tags nixl -run '^$' -bench TwoProcess -benchtime 20x ./nixl/
func BenchmarkTwoProcess64MiB(b *testing.B) {
	for _, v := range variants {
		for _, bs := range []int{8 << 10, 1 << 20} {
			for _, mode := range []string{"raw", "raw-parked", "session", "session-sync"} {
				b.Run(fmt.Sprintf("ucx-%s/%s/%dKiB", v.name, mode, bs>>10), func(b *testing.B) {
					if v.tls != "" {
						b.Setenv("UCX_TLS", v.tls)
					}
					benchFetch(b, mode, bs, v)
				})
			}
		}
	}
	for _, bs := range []int{8 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("tcp-plane/%dKiB", bs>>10), func(b *testing.B) { benchFetch(b, "tcp", bs, variant{}) })
		b.Run(fmt.Sprintf("shm-plane/%dKiB", bs>>10), func(b *testing.B) { benchFetch(b, "shm", bs, variant{}) })
	}
}

func benchFetch(b *testing.B, mode string, bs int, v variant) {
	parked := mode == "raw-parked"
	if parked {
		mode = "raw"
	}
	f := newFetcher(b, mode, bs, v)
	verify(b, f.region(), f.fetch(b, 0), 0) // connects, and checks once
	b.SetBytes(fetchBytes)
	b.ResetTimer()
	for i := range b.N {
		if parked {
			// As a step loop waits for its ack: the thread that posts
			// has just woken from a sleep (not timed).
			b.StopTimer()
			time.Sleep(parkFor)
			b.StartTimer()
		}
		f.fetch(b, i%childItems)
	}
}

// parkFor is how long raw-parked sleeps before each READ: about a
// request's round trip here.
const parkFor = 300 * time.Microsecond

// BenchmarkTwoProcessPaired measures the session path against raw NIXL
// fetch by fetch: each iteration fetches 64 MiB once through each (from
// two producer processes, the order alternating), so both see the same
// moments of a noisy machine. The raw producer expects READs throughout,
// so its agent is driven also while the session fetches, which costs the
// session path a little CPU: the ratio errs against it. It reports
// both rates and session-% (the session's rate as a percentage of raw's
// over the same iterations).
//
//	go test -tags nixl -run '^$' -bench TwoProcessPaired -benchtime 30x ./nixl/
func BenchmarkTwoProcessPaired(b *testing.B) {
	for _, v := range variants {
		for _, bs := range []int{8 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("ucx-%s/%dKiB", v.name, bs>>10), func(b *testing.B) {
				if v.tls != "" {
					b.Setenv("UCX_TLS", v.tls)
				}
				benchPaired(b, bs, v)
			})
		}
	}
}

func benchPaired(b *testing.B, bs int, v variant) {
	fs := [2]fetcher{newFetcher(b, "raw", bs, v), newFetcher(b, "session", bs, v)}
	for _, f := range fs {
		verify(b, f.region(), f.fetch(b, 0), 0) // connects, and checks once
	}
	var took [2]time.Duration
	b.ResetTimer()
	for i := range b.N {
		for k := range 2 {
			j := (i + k) % 2 // raw first on even iterations
			t0 := time.Now()
			fs[j].fetch(b, i%childItems)
			took[j] += time.Since(t0)
		}
	}
	b.StopTimer()
	rate := func(d time.Duration) float64 { return float64(b.N) * fetchBytes / d.Seconds() / 1e6 }
	b.ReportMetric(0, "ns/op") // an op is two fetches: the rates say more
	b.ReportMetric(rate(took[0]), "raw-MB/s")
	b.ReportMetric(rate(took[1]), "session-MB/s")
	b.ReportMetric(100*took[0].Seconds()/took[1].Seconds(), "session-%")
}
