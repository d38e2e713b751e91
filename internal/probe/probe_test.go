package probe

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/internal/demo"
	"github.com/ecxfer/ecxfer/internal/hooks"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
)

func startProducer(t *testing.T) (demo.Config, *demo.Producer) {
	t.Helper()
	cfg := demo.Config{Items: 4, BlocksPerItem: 2, BlockSize: 1024, Data: "tcp"}
	p, err := demo.StartProducer(cfg, "127.0.0.1:0", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return cfg, p
}

func probe(t *testing.T, cfg Config) (Report, string) {
	t.Helper()
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	return rep, out.String()
}

// Each answer a live producer can give reads as what it means.
func TestProbeAnswers(t *testing.T) {
	dc, p := startProducer(t)
	base := Config{Producer: p.Control, CompatHash: dc.CompatHash(), Timeout: 5 * time.Second}
	for _, tc := range []struct {
		name   string
		cfg    func(Config) Config
		status wire.Status
		says   string
	}{
		{"healthy", func(c Config) Config { return c }, wire.NackMissing, "HEALTHY"},
		{"missing", func(c Config) Config { c.MMHash = "absent"; return c }, wire.NackMissing, "does not hold absent"},
		{"incompat", func(c Config) Config { c.CompatHash = "other"; return c }, wire.NackIncompat, "NACK_INCOMPAT"},
		{"version", func(c Config) Config { c.Version = 7; return c }, wire.NackVersion, "NACK_VERSION"},
		{"ok", func(c Config) Config { c.MMHash = demo.Hash(1); return c }, wire.OK, "granted it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, out := probe(t, tc.cfg(base))
			if !rep.Reachable || !rep.Answered || rep.Status != tc.status || !strings.Contains(out, tc.says) {
				t.Fatalf("report %+v\n%s", rep, out)
			}
		})
	}
}

// -fetch brings the entry's bytes and their checksum.
func TestProbeFetch(t *testing.T) {
	dc, p := startProducer(t)
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: 8, BlockSize: dc.BlockSize})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	data, err := transport.NewTCPData(transport.TCPConfig{}, region)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	rep, out := probe(t, Config{Producer: p.Control, CompatHash: dc.CompatHash(), MMHash: demo.Hash(2), Timeout: 5 * time.Second,
		Fetch: true, Data: data, Region: region, BlockSize: dc.BlockSize})
	want := sha256.New()
	b := make([]byte, dc.BlockSize)
	for j := range 2 {
		demo.Fill(b, 2, j)
		want.Write(b)
	}
	if !rep.Fetched || rep.Bytes != 2*dc.BlockSize || rep.SHA256 != hex.EncodeToString(want.Sum(nil)) {
		t.Fatalf("report %+v\n%s", rep, out)
	}
}

// Nothing listening, and a listener that never speaks ZeroMQ.
func TestProbeUnreachableAndSilent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rep, out := probe(t, Config{Producer: "tcp://" + addr, CompatHash: "x", Timeout: time.Second})
	if rep.Reachable || !strings.Contains(out, "UNREACHABLE") {
		t.Fatalf("closed port: %+v\n%s", rep, out)
	}

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	rep, out = probe(t, Config{Producer: "tcp://" + silent.Addr().String(), CompatHash: "x", Timeout: 300 * time.Millisecond})
	if !rep.Reachable || rep.Answered || !strings.Contains(out, "NO ANSWER") {
		t.Fatalf("silent listener: %+v\n%s", rep, out)
	}
}

// An entry announced but not saved yet reads as NACK_NOT_READY; the
// answer of a producer shutting down as NACK_INTERNAL.
func TestProbeNotReady(t *testing.T) {
	region, err := cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	entries := cache.NewEmbeddingCache(4)
	if _, err := entries.Alloc("pending", 2); err != nil {
		t.Fatal(err)
	}
	data, err := transport.NewTCPData(transport.TCPConfig{Listen: "127.0.0.1:0"}, region)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	srv, err := transport.Listen("tcp://127.0.0.1:0", transport.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	prod, err := connector.NewProducer(connector.ProducerConfig{CompatHash: "c"}, srv, data, entries)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { prod.Serve(ctx); close(done) }()
	defer func() { cancel(); <-done; prod.Close() }()
	rep, out := probe(t, Config{Producer: srv.Endpoint(), CompatHash: "c", MMHash: "pending", Timeout: 5 * time.Second})
	if rep.Status != wire.NackNotReady || !strings.Contains(out, "NACK_NOT_READY") {
		t.Fatalf("report %+v\n%s", rep, out)
	}
	// A producer draining answers NACK_INTERNAL.
	hooks.StopGranting(prod)
	rep, out = probe(t, Config{Producer: srv.Endpoint(), CompatHash: "c", Timeout: 5 * time.Second})
	if rep.Status != wire.NackInternal || !strings.Contains(out, "shutting down") {
		t.Fatalf("producer shutting down: report %+v\n%s", rep, out)
	}
}

// The probe speaks to a Python producer over the real libzmq (Debian's
// python3-zmq): what an operator points it at in a vLLM fleet.
func TestProbePythonProducer(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI needs python3-zmq and python3-msgpack: %v", err)
		}
		t.Skipf("python3-zmq or python3-msgpack missing: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(python, filepath.Join("testdata", "py_producer.py"), "tcp://"+addr, "compat-py")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("python producer: %q %v", line, err)
	}
	for _, tc := range []struct {
		cfg    Config
		status wire.Status
		says   string
	}{
		{Config{CompatHash: "compat-py"}, wire.NackMissing, "HEALTHY"},
		{Config{CompatHash: "other"}, wire.NackIncompat, "NACK_INCOMPAT"},
		{Config{CompatHash: "compat-py", Version: 1}, wire.NackVersion, "NACK_VERSION"},
	} {
		tc.cfg.Producer, tc.cfg.Timeout = "tcp://"+addr, 5*time.Second
		rep, text := probe(t, tc.cfg)
		if rep.Status != tc.status || !strings.Contains(text, tc.says) {
			t.Errorf("report %+v\n%s", rep, text)
		}
	}
}
