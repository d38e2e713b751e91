// Package examples_test runs the example programs as a user would.
package examples_test

import (
	"bufio"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	// The programs are built with go build, which the test cache does not
	// see: linking the library in (and reading the sources below) makes
	// a change to either invalidate cached results.
	_ "github.com/ecxfer/ecxfer/internal/demo"
)

// programs are the example programs, built once (in one go build) for the
// tests that run them.
var programs struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

// build returns the path of the example program pkg, building every example
// program on first use.
func build(t *testing.T, pkg string) string {
	t.Helper()
	programs.once.Do(func() {
		names := []string{"producer", "consumer", "loopback", "probe"}
		for _, name := range names {
			ents, err := os.ReadDir(name)
			if err != nil {
				programs.err = err
				return
			}
			for _, e := range ents {
				if _, err := os.ReadFile(filepath.Join(name, e.Name())); err != nil {
					programs.err = err
					return
				}
			}
		}
		if programs.dir, programs.err = os.MkdirTemp("", "ecxfer-examples-"); programs.err != nil {
			return
		}
		// No DWARF: the tests need no debugger, and linking is most of the cost.
		args := []string{"build", "-tags", buildTags, "-ldflags=-w", "-o", programs.dir + string(filepath.Separator)}
		for _, name := range names {
			args = append(args, "github.com/ecxfer/ecxfer/examples/"+name)
		}
		programs.out, programs.err = exec.Command("go", args...).CombinedOutput()
	})
	if programs.err != nil {
		t.Fatalf("go build: %v\n%s", programs.err, programs.out)
	}
	return filepath.Join(programs.dir, filepath.Base(pkg))
}

// The producer and consumer programs as two processes, over each data plane
// of this build: the consumer verifies every item.
func TestProducerConsumerPrograms(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two programs")
	}
	prodBin := build(t, "producer")
	consBin := build(t, "consumer")
	for _, plane := range planes {
		t.Run(plane.name, func(t *testing.T) {
			for k, v := range plane.env {
				t.Setenv(k, v)
			}
			sizes := append([]string{"-items", "300", "-blocks-per-item", "4", "-block-size", "4096"}, plane.args...)
			runPrograms(t, prodBin, consBin, sizes, []string{"-concurrency", "16"}, 300)
		})
	}
}

// runPrograms runs the producer with sizes and the consumer with sizes and
// consArgs, and checks that it verified items; it returns the consumer's
// output.
func runPrograms(t *testing.T, prodBin, consBin string, sizes, consArgs []string, items int) []byte {
	prod := exec.Command(prodBin, append([]string{"-control", "127.0.0.1:0", "-data-addr", "127.0.0.1:0"}, sizes...)...)
	out, err := prod.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	prod.Stderr = os.Stderr
	if err := prod.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		prod.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- prod.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("producer exit: %v", err)
			}
		case <-time.After(10 * time.Second):
			prod.Process.Kill()
			t.Error("producer did not stop on SIGTERM")
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "ready" {
		t.Fatalf("producer said %q", line)
	}
	cons := exec.Command(consBin, append(append([]string{"-producer", f[1]}, consArgs...), sizes...)...)
	res, err := cons.Output()
	if err != nil {
		t.Fatalf("consumer: %v\n%s", err, res)
	}
	m := regexp.MustCompile(`verified (\d+) transfers \((\d+) failed\)`).FindSubmatch(res)
	if m == nil || string(m[1]) != strconv.Itoa(items) || string(m[2]) != "0" {
		t.Fatalf("consumer output:\n%s", res)
	}
	return res
}

// The main job with defaults exits 0 after verifying every block by content, and so
// does it over every other data plane of this build.
func TestLoopbackDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the main job")
	}
	bin := build(t, "loopback")
	for _, plane := range planes {
		t.Run(plane.name, func(t *testing.T) {
			cmd := exec.Command(bin, plane.args...)
			cmd.Env = os.Environ()
			for k, v := range plane.env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("loopback: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "verified 1000 transfers (0 failed)") || !strings.Contains(string(out), "GB/s") {
				t.Fatalf("loopback output:\n%s", out)
			}
			// The producer's counters are read once its grants have ended:
			// every grant's notification is counted, none by its lease.
			m := regexp.MustCompile(`producer: requests \d+, grants (\d+), completions (\d+), .* lease expiries (\d+)`).FindStringSubmatch(string(out))
			if m == nil || m[1] != m[2] || m[3] != "0" {
				t.Fatalf("producer's grants and completions differ:\n%s", out)
			}
		})
	}
}

// flagSet reports whether the named flag was given on the command line.
func flagSet(name string) (set bool) {
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// plane is a data plane the programs are run over.
type plane struct {
	name string
	args []string
	env  map[string]string
}

// A short soak: two producers and four consumers for 30 s (-soak.for),
// every fetch verified; after a warm-up, the process's RSS, goroutines
// and open descriptors stay flat (RSS within 5 % and 16 MiB, goroutines
// and descriptors within 4). It runs with ECXFER_LONG=1 (CI sets it) or
// when -soak.for is given.
var soakFor = flag.Duration("soak.for", 30*time.Second, "how long TestLoopbackSoak runs")

func TestLoopbackSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a 30 s soak")
	}
	if os.Getenv("ECXFER_LONG") != "1" && !flagSet("soak.for") {
		t.Skip("a 30 s soak: set ECXFER_LONG=1 (or -soak.for) to run it")
	}
	bin := build(t, "loopback")
	out, err := exec.Command(bin, "-producers", "2", "-consumers", "4", "-concurrency", "16", "-items", "256",
		"-duration", soakFor.String()).Output()
	if err != nil {
		t.Fatalf("loopback: %v\n%s", err, out)
	}
	// "... RSS 419.3 MiB, 38 goroutines, 23 fds" a second.
	re := regexp.MustCompile(`failed (\d+) .* RSS ([\d.]+) MiB, (\d+) goroutines, (\d+) fds`)
	type sample struct {
		rss      float64
		gor, fds int
	}
	var samples []sample
	for _, line := range strings.Split(string(out), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if m[1] != "0" {
			t.Fatalf("failures during the soak: %s", line)
		}
		var s sample
		s.rss, _ = strconv.ParseFloat(m[2], 64)
		s.gor, _ = strconv.Atoi(m[3])
		s.fds, _ = strconv.Atoi(m[4])
		samples = append(samples, s)
	}
	if len(samples) < 10 {
		t.Fatalf("%d progress lines:\n%s", len(samples), out)
	}
	warm, last := samples[len(samples)/4], samples[len(samples)-1]
	if last.rss > warm.rss*1.05+16 || last.gor > warm.gor+4 || last.fds > warm.fds+4 {
		t.Fatalf("not flat: after warm-up %+v, at the end %+v\n%s", warm, last, out)
	}
	t.Logf("after warm-up %+v, at the end %+v", warm, last)
}
