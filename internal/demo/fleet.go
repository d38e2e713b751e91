package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ecxfer/ecxfer/internal/hist"
	"github.com/ecxfer/ecxfer/session/connector"
)

// latencies keeps at most 1<<16 samples (reservoir sampling), so that a
// long run's memory stays flat while its quantiles stay exact enough.
type latencies struct {
	n   int
	s   []time.Duration
	rng *rand.Rand
}

const maxSamples = 1 << 16

func (l *latencies) add(d time.Duration) {
	l.n++
	if len(l.s) < maxSamples {
		l.s = append(l.s, d)
		return
	}
	if l.rng == nil {
		l.rng = rand.New(rand.NewPCG(1, 2))
	}
	if k := l.rng.IntN(l.n); k < maxSamples {
		l.s[k] = d
	}
}

func (l *latencies) quantile(q float64) time.Duration {
	if len(l.s) == 0 {
		return 0
	}
	s := slices.Clone(l.s)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// Live counts what the consumers of a run do, for the per-second progress
// lines. Safe for concurrent use.
type Live struct {
	mu     sync.Mutex
	done   uint64
	fails  uint64
	bytes  uint64
	second hist.Histogram // latencies since the last line
	pools  []*connector.Pool
}

func (l *Live) completed(d time.Duration, bytes uint64) {
	l.mu.Lock()
	l.done++
	l.bytes += bytes
	l.second.Add(d)
	l.mu.Unlock()
}

func (l *Live) failed() {
	l.mu.Lock()
	l.fails++
	l.mu.Unlock()
}

func (l *Live) watch(p *connector.Pool) {
	l.mu.Lock()
	l.pools = append(l.pools, p)
	l.mu.Unlock()
}

// Tick is one second of a run, as a line of progress (and, between
// processes, a JSON line).
type Tick struct {
	Done, Failed, Bytes, Retries uint64 // totals so far
	Second                       hist.Histogram
	Proc                         ProcStats // this process (between processes: the consumers' sum)
}

// tick takes the totals and the latencies since the last tick.
func (l *Live) tick() Tick {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := Tick{Done: l.done, Failed: l.fails, Bytes: l.bytes, Second: l.second, Proc: ReadProcStats()}
	for _, p := range l.pools {
		t.Retries += p.Stats().Retries
	}
	l.second = hist.Histogram{}
	return t
}

// ProcStats is a process's footprint.
type ProcStats struct {
	RSS        uint64 // bytes
	Goroutines int
	FDs        int
}

// ReadProcStats reads this process's RSS and open descriptors from /proc.
func ReadProcStats() ProcStats {
	s := ProcStats{Goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseUint(f[1], 10, 64)
			s.RSS = pages * uint64(os.Getpagesize())
		}
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.FDs = len(ents)
	}
	return s
}

func (s ProcStats) String() string {
	return fmt.Sprintf("RSS %.1f MiB, %d goroutines, %d fds", float64(s.RSS)/(1<<20), s.Goroutines, s.FDs)
}

// FleetConfig is the shape of a load run.
type FleetConfig struct {
	Producers, Consumers int
	Duration             time.Duration // each consumer asks this long after its set-up (0: cfg.Fetches or cfg.Items)
	Procs                bool          // producers and consumers as processes (re-running this binary)
	Self                 []string      // the command that re-runs this binary, without role flags
}

// FleetSummary is the outcome of a load run.
type FleetSummary struct {
	Summary
	Procs []ProcReport
}

// ProcReport is one process's footprint at the start and at the end.
type ProcReport struct {
	Role       string
	Start, End ProcStats
}

// RunFleet runs cfg's workload with fc's producers and consumers, printing
// a line a second to out, and returns the summed summary. Every consumer
// fetches from every producer.
func RunFleet(ctx context.Context, cfg Config, fc FleetConfig, out io.Writer, log *slog.Logger) (FleetSummary, error) {
	if fc.Procs {
		return runFleetProcs(ctx, cfg, fc, out, log)
	}
	start := ReadProcStats()
	var eps []string
	for range fc.Producers {
		p, err := StartProducer(cfg, "127.0.0.1:0", "127.0.0.1:0", log)
		if err != nil {
			return FleetSummary{}, err
		}
		defer p.Close()
		eps = append(eps, p.Control)
	}
	live := &Live{}
	sums := make([]Summary, fc.Consumers)
	errs := make([]error, fc.Consumers)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range fc.Consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sums[i], errs[i] = consume(ctx, cfg, eps, fc.Duration, nil, live, log)
		}()
	}
	stop := make(chan struct{})
	ticked := make(chan struct{})
	go func() { defer close(ticked); progress(out, live.tick, stop) }()
	wg.Wait()
	close(stop)
	<-ticked
	fs := FleetSummary{Summary: merge(sums, time.Since(t0))}
	fs.Procs = []ProcReport{{Role: "all (goroutines)", Start: start, End: ReadProcStats()}}
	return fs, errors.Join(errs...)
}

// progress prints a line a second from tick until stop closes.
func progress(out io.Writer, tick func() Tick, stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last Tick
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := tick()
		fmt.Fprintf(out, "  %6d/s  %5.2f GB/s  p50 %-8v p99 %-8v failed %d  retries %d  %v\n",
			now.Done-last.Done, float64(now.Bytes-last.Bytes)/1e9, now.Second.Quantile(0.5).Round(time.Microsecond), now.Second.Quantile(0.99).Round(time.Microsecond),
			now.Failed, now.Retries, now.Proc)
		last = now
	}
}

// merge sums consumers' summaries; latency quantiles are the worst
// consumer's (they are not additive).
// merge sums the consumers' summaries. The time is from the first
// consumer's first fetch to the last one's end (the rates leave process
// and agent setup out); elapsed, from before the setup, if a summary has
// no start (a consumer that failed to set up).
func merge(sums []Summary, elapsed time.Duration) Summary {
	m := Summary{Elapsed: elapsed, FailedWhy: map[string]int{}, Steal: -1}
	var first, last time.Time
	for _, s := range sums {
		if s.Start.IsZero() {
			first, last = time.Time{}, time.Time{}
			break
		}
		if end := s.Start.Add(s.Elapsed); last.IsZero() || end.After(last) {
			last = end
		}
		if first.IsZero() || s.Start.Before(first) {
			first = s.Start
		}
	}
	if !first.IsZero() {
		m.Start, m.Elapsed = first, last.Sub(first)
	}
	for _, s := range sums {
		m.Steal = max(m.Steal, s.Steal) // the machine's, over much the same time
		m.Verified += s.Verified
		m.Failed += s.Failed
		m.Bytes += s.Bytes
		m.Quarantined += s.Quarantined
		m.P50, m.P99 = max(m.P50, s.P50), max(m.P99, s.P99)
		m.MaxInFlight = max(m.MaxInFlight, s.MaxInFlight) // per consumer
		m.Stats.Retries += s.Stats.Retries
		m.Stats.AckTimeouts += s.Stats.AckTimeouts
		m.Stats.Quarantines += s.Stats.Quarantines
		m.Stats.PeerDeaths += s.Stats.PeerDeaths
		for st, n := range s.Stats.Nacks {
			m.Stats.Nacks[st] += n
		}
		for k, v := range s.FailedWhy {
			m.FailedWhy[k] += v
		}
	}
	return m
}

// Print writes the summary and each process's footprint.
func (f FleetSummary) Print(w io.Writer) {
	f.Summary.Print(w)
	for _, p := range f.Procs {
		fmt.Fprintf(w, "  %s: start %v; end %v\n", p.Role, p.Start, p.End)
	}
}

// ---- processes ----

// The child roles (RunRole): a producer prints "control <endpoint>" and
// serves until its stdin closes, then prints "proc <json>"; a consumer
// prints "tick <json>" a second and "done <json>" at the end.

// RunRole runs this process as one member of a fleet: role "producer" or
// "consumer" (then producers are the control endpoints).
func RunRole(ctx context.Context, role string, cfg Config, producers []string, d time.Duration, log *slog.Logger) error {
	start := ReadProcStats()
	enc := json.NewEncoder(os.Stdout)
	var mu sync.Mutex
	emit := func(kind string, v any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Print(kind, " ")
		enc.Encode(v)
	}
	switch role {
	case "producer":
		p, err := StartProducer(cfg, "127.0.0.1:0", "127.0.0.1:0", log)
		if err != nil {
			return err
		}
		fmt.Println("control", p.Control)
		io.Copy(io.Discard, os.Stdin)
		p.Close()
		emit("proc", ProcReport{Role: "producer", Start: start, End: ReadProcStats()})
		return nil
	case "consumer":
		live := &Live{}
		stop := make(chan struct{})
		ticked := make(chan struct{})
		go func() {
			defer close(ticked)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					emit("tick", live.tick())
				}
			}
		}()
		sum, err := consume(ctx, cfg, producers, d, nil, live, log)
		close(stop)
		<-ticked
		emit("done", struct {
			Summary Summary
			Err     string
			Proc    ProcReport
		}{sum, fmt.Sprint(err), ProcReport{Role: "consumer", Start: start, End: ReadProcStats()}})
		return err
	}
	return fmt.Errorf("unknown role %q", role)
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startChild(self []string, args ...string) (*child, error) {
	cmd := exec.Command(self[0], append(slices.Clone(self[1:]), args...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

func runFleetProcs(ctx context.Context, cfg Config, fc FleetConfig, out io.Writer, log *slog.Logger) (FleetSummary, error) {
	var fs FleetSummary
	shape := cfg.Args()
	var prods []*child
	defer func() {
		for _, p := range prods {
			p.stdin.Close()
			p.cmd.Wait()
		}
	}()
	var eps []string
	for range fc.Producers {
		c, err := startChild(fc.Self, append([]string{"-role", "producer"}, shape...)...)
		if err != nil {
			return fs, err
		}
		prods = append(prods, c)
		line, ok := <-c.lines
		ep, found := strings.CutPrefix(line, "control ")
		if !ok || !found {
			return fs, fmt.Errorf("producer process said %q", line)
		}
		eps = append(eps, ep)
	}
	var cons []*child
	started := false // every consumer runs: each is waited for below
	defer func() {
		if !started { // one failed to start: end the others
			for _, c := range cons {
				c.cmd.Process.Kill()
				c.cmd.Wait()
			}
		}
	}()
	t0 := time.Now()
	for range fc.Consumers {
		args := append([]string{"-role", "consumer", "-producer-list", strings.Join(eps, ","),
			"-duration", fc.Duration.String()}, shape...)
		c, err := startChild(fc.Self, args...)
		if err != nil {
			return fs, err
		}
		cons = append(cons, c)
	}
	started = true
	// Each consumer's latest tick; a line a second sums them.
	var mu sync.Mutex
	latest := make([]Tick, len(cons))
	var second hist.Histogram
	sums := make([]Summary, len(cons))
	var errs []error
	var wg sync.WaitGroup
	for i, c := range cons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for line := range c.lines {
				kind, js, _ := strings.Cut(line, " ")
				switch kind {
				case "tick":
					var t Tick
					if json.Unmarshal([]byte(js), &t) == nil {
						mu.Lock()
						latest[i] = t
						second.Merge(&t.Second)
						mu.Unlock()
					}
				case "done":
					var d struct {
						Summary Summary
						Err     string
						Proc    ProcReport
					}
					if err := json.Unmarshal([]byte(js), &d); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("consumer %d: %w", i, err))
						mu.Unlock()
						continue
					}
					mu.Lock()
					sums[i] = d.Summary
					fs.Procs = append(fs.Procs, d.Proc)
					if d.Err != "<nil>" {
						errs = append(errs, fmt.Errorf("consumer %d: %s", i, d.Err))
					}
					mu.Unlock()
				}
			}
			if err := c.cmd.Wait(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("consumer %d: %w", i, err))
				mu.Unlock()
			}
		}()
	}
	stop := make(chan struct{})
	ticked := make(chan struct{})
	go func() {
		defer close(ticked)
		progress(out, func() Tick {
			mu.Lock()
			defer mu.Unlock()
			var t Tick
			for _, l := range latest {
				t.Done += l.Done
				t.Failed += l.Failed
				t.Bytes += l.Bytes
				t.Retries += l.Retries
				t.Proc.RSS += l.Proc.RSS
				t.Proc.Goroutines += l.Proc.Goroutines
				t.Proc.FDs += l.Proc.FDs
			}
			t.Second, second = second, hist.Histogram{}
			return t
		}, stop)
	}()
	wg.Wait()
	close(stop)
	<-ticked
	for _, p := range prods {
		p.stdin.Close()
		for line := range p.lines {
			if js, ok := strings.CutPrefix(line, "proc "); ok {
				var r ProcReport
				if json.Unmarshal([]byte(js), &r) == nil {
					fs.Procs = append(fs.Procs, r)
				}
			}
		}
	}
	fs.Summary = merge(sums, time.Since(t0))
	return fs, errors.Join(errs...)
}
