package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
)

var raceEnabled bool

var (
	seed  = flag.Uint64("sim.seed", 0, "replay one seed")
	seeds = flag.Int("sim.seeds", defaultSeeds(), "seeds to run (default: $ECXFER_SIM_SEEDS, else 40 with ECXFER_LONG=1, else 8)")
	first = flag.Uint64("sim.first", 1, "first seed")
)

// defaultSeeds is $ECXFER_SIM_SEEDS (CI sets it, see .ci/run), else 40
// seeds with ECXFER_LONG=1 (the long test run, which CI makes too), else a
// set small enough for a plain go test to take seconds.
func defaultSeeds() int {
	if n, err := strconv.Atoi(os.Getenv("ECXFER_SIM_SEEDS")); err == nil && n > 0 {
		return n
	}
	if os.Getenv("ECXFER_LONG") == "1" {
		return 40
	}
	return 8
}

// TestSimulation runs a fixed set of seeds (flags: -sim.seeds, -sim.first;
// -sim.seed replays one, with its trace on failure), on every processor.
func TestSimulation(t *testing.T) {
	if *seed != 0 {
		st, err := Run(DefaultConfig(*seed))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seed %d: %+v", *seed, st)
		return
	}
	n := *seeds
	if testing.Short() || raceEnabled {
		// The race detector makes a seed ten times slower; CI runs the
		// full set without it as well.
		n = min(n, 20)
	}
	workers := max(runtime.GOMAXPROCS(0), 2)
	for w := range workers {
		t.Run(fmt.Sprint(w), func(t *testing.T) {
			t.Parallel()
			var total Stats
			runs := 0
			for i := w; i < n; i += workers {
				s := *first + uint64(i)
				st, err := Run(DefaultConfig(s))
				if err != nil {
					// The other seeds still run: a long set reports
					// every failing seed.
					t.Errorf("%v\nreplay: go test ./internal/sim -run TestSimulation -sim.seed %d", err, s)
				}
				total.add(st)
				runs++
			}
			t.Logf("worker %d: %d seeds, %+v", w, runs, total)
		})
	}
}

// The same seed gives the same run.
func TestDeterministic(t *testing.T) {
	a, errA := Run(DefaultConfig(42))
	b, errB := Run(DefaultConfig(42))
	if (errA == nil) != (errB == nil) || a != b {
		t.Fatalf("two runs of seed 42 differ:\n%+v %v\n%+v %v", a, errA, b, errB)
	}
	if a.Fetches == 0 || a.Completed == 0 || a.Failed == 0 || a.Reaped == 0 {
		t.Fatalf("the run did nothing interesting: %+v", a)
	}
}
