// Package probe asks a live producer, Go or vLLM's Python one, what an
// operator needs to know when fetches fail: is it reachable, does it speak
// our protocol version, does it have our compatibility hash, and can an
// entry be fetched from it, in plain words.
package probe

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/session/connector"
	"github.com/ecxfer/ecxfer/transport"
	"github.com/ecxfer/ecxfer/wire"
	"github.com/ecxfer/ecxfer/xfer"
)

// Config says what to ask.
type Config struct {
	Producer   string // control endpoint, tcp://host:port
	CompatHash string // ours; required
	// MMHash is the entry to ask for; empty asks for a random one, which a
	// healthy producer answers NACK_MISSING.
	MMHash string
	// Version is the connector version to claim; zero is ours.
	Version int64
	Timeout time.Duration // for each step; default 3 s
	// Fetch fetches MMHash over Data (which the caller built over a region
	// of BlockSize blocks, at least as many as the entry has) after the
	// probe, and reports its bytes.
	Fetch     bool
	Data      xfer.DataTransport
	Region    *cache.Region
	BlockSize int
	Logger    *slog.Logger
}

// Report is what the probe found.
type Report struct {
	Reachable   bool
	ConnectTime time.Duration // TCP connect
	Answered    bool
	RoundTrip   time.Duration // request to ack
	Status      wire.Status
	Blocks      int // in an OK ack
	Fetched     bool
	FetchTime   time.Duration
	Bytes       int
	SHA256      string // of the fetched bytes
	FetchErr    string // why the fetch failed
}

// Run probes the producer and writes what it found to out, a line a
// finding. The error is for a probe that could not run (bad config);
// what the producer did wrong is in the report.
func Run(ctx context.Context, cfg Config, out io.Writer) (Report, error) {
	var rep Report
	if cfg.CompatHash == "" {
		return rep, fmt.Errorf("%w: probe: compat hash required", xfer.ErrBadConfig)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	hostport := strings.TrimPrefix(cfg.Producer, "tcp://")
	start := time.Now()
	c, err := net.DialTimeout("tcp", hostport, cfg.Timeout)
	if err != nil {
		fmt.Fprintf(out, "UNREACHABLE: cannot connect to %s: %v\n", hostport, err)
		fmt.Fprintln(out, "  check: the producer runs, its -control address, firewalls between the hosts")
		return rep, nil
	}
	rep.Reachable, rep.ConnectTime = true, time.Since(start)
	c.Close()
	fmt.Fprintf(out, "reachable: %s, TCP connect %v\n", hostport, rep.ConnectTime.Round(time.Microsecond))

	mm := cfg.MMHash
	if mm == "" {
		var b [16]byte
		rand.Read(b[:])
		mm = "ecxfer-probe-" + hex.EncodeToString(b[:])
	}
	ctl := transport.NewClient(transport.ClientConfig{Logger: cfg.Logger, ConnectTimeout: cfg.Timeout, HandshakeTimeout: cfg.Timeout})
	defer ctl.Close()
	req := wire.XferReq{MMHash: mm, CompatibilityHash: cfg.CompatHash, SessionID: uuid.NewString(), VersionOnWire: true}
	if cfg.Version != 0 {
		v := wire.IntOf(cfg.Version)
		req.ConnectorVersion = &v
	}
	start = time.Now()
	if err := ctl.Send(cfg.Producer, wire.AppendReq(nil, &req)); err != nil {
		return rep, fmt.Errorf("probe: %w", err)
	}
	var ack wire.XferAck
	wctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	for !rep.Answered {
		if !ctl.Wait(wctx) {
			break
		}
		for _, in := range ctl.Drain(nil) {
			if err := wire.DecodeAck(in.Payload, &ack); err != nil {
				fmt.Fprintf(out, "MALFORMED: the producer answered something that is not an XferAck: %v\n", err)
				continue
			}
			rep.Answered, rep.RoundTrip, rep.Status, rep.Blocks = true, time.Since(start), ack.Status, len(ack.SrcBlockIndices)
		}
		if dead := ctl.Dead(nil); len(dead) > 0 && !rep.Answered {
			fmt.Fprintln(out, "NO ANSWER: the connection was dropped before an answer (not a ZeroMQ ROUTER, or it refused our handshake)")
			return rep, nil
		}
	}
	if !rep.Answered {
		fmt.Fprintf(out, "NO ANSWER within %v: reachable, but nothing answered the request\n", cfg.Timeout)
		fmt.Fprintln(out, "  check: the address is the producer's control port (not its data port); the producer's loop runs (Step or Serve)")
		return rep, nil
	}
	rt := rep.RoundTrip.Round(time.Microsecond)
	switch ack.Status {
	case wire.OK:
		fmt.Fprintf(out, "OK in %v: the producer holds %s (%d blocks) and granted it\n", rt, mm, rep.Blocks)
	case wire.NackMissing:
		if cfg.MMHash == "" {
			fmt.Fprintf(out, "HEALTHY: answered NACK_MISSING for a random mm_hash in %v: same protocol version and compatibility hash\n", rt)
		} else {
			fmt.Fprintf(out, "NACK_MISSING in %v: the producer does not hold %s (never saved, or evicted)\n", rt, mm)
		}
	case wire.NackIncompat:
		fmt.Fprintf(out, "NACK_INCOMPAT in %v: the producer's compatibility hash differs from ours, %s\n", rt, cfg.CompatHash)
		fmt.Fprintln(out, "  check: the same vLLM version, model, dtype and block size bytes on both sides")
	case wire.NackVersion:
		fmt.Fprintf(out, "NACK_VERSION in %v: the producer speaks another connector version than %s\n", rt, req.Version())
	case wire.NackNotReady:
		fmt.Fprintf(out, "NACK_NOT_READY in %v: %s is announced but its save has not landed (or this consumer pins too much)\n", rt, mm)
	case wire.NackInternal:
		fmt.Fprintf(out, "NACK_INTERNAL in %v: the producer is shutting down, or refused the request by a bound; its log says which\n", rt)
	default:
		fmt.Fprintf(out, "%s in %v: the producer refused the request\n", ack.Status, rt)
	}
	if cfg.Fetch && ack.Status == wire.OK {
		fetch(ctx, cfg, mm, rep.Blocks, &rep, out)
	}
	return rep, nil
}

func fetch(ctx context.Context, cfg Config, mm string, n int, rep *Report, out io.Writer) {
	if cfg.Data == nil || cfg.Region == nil || n > cfg.Region.Blocks() {
		rep.FetchErr = "no data plane, or too few local blocks"
		fmt.Fprintf(out, "FETCH not run: %s (the entry has %d blocks)\n", rep.FetchErr, n)
		return
	}
	ctl := transport.NewClient(transport.ClientConfig{Logger: cfg.Logger})
	defer ctl.Close()
	pool, err := connector.NewPool(connector.PoolConfig{CompatHash: cfg.CompatHash, BlockSize: cfg.BlockSize, Logger: cfg.Logger}, ctl, cfg.Data)
	if err != nil {
		rep.FetchErr = err.Error()
		fmt.Fprintln(out, "FETCH not run:", err)
		return
	}
	defer pool.Close()
	blocks := make([]int, n)
	for i := range blocks {
		blocks[i] = i
	}
	start := time.Now()
	if _, err := pool.Fetch(cfg.Producer, mm, blocks, start.Add(cfg.Timeout), start); err != nil {
		rep.FetchErr = err.Error()
		fmt.Fprintln(out, "FETCH failed to start:", err)
		return
	}
	for pool.InFlight() > 0 && pool.Wait(ctx) {
		r := pool.Step(time.Now())
		for range r.Completed {
			rep.Fetched, rep.FetchTime = true, time.Since(start)
		}
		for _, f := range r.Failed {
			rep.FetchErr = f.Reason.String()
			if f.Reason == xfer.Nacked {
				rep.FetchErr += " " + f.Status.String()
			}
		}
	}
	if !rep.Fetched {
		if rep.FetchErr == "" {
			rep.FetchErr = errors.Join(ctx.Err(), errors.New("not completed")).Error()
		}
		fmt.Fprintf(out, "FETCH failed: %s\n", rep.FetchErr)
		return
	}
	h := sha256.New()
	for _, b := range blocks {
		h.Write(cfg.Region.Block(b))
	}
	rep.Bytes = n * cfg.BlockSize
	rep.SHA256 = hex.EncodeToString(h.Sum(nil))
	fmt.Fprintf(out, "FETCHED %s: %d bytes in %v, sha256 %s\n", mm, rep.Bytes, rep.FetchTime.Round(time.Microsecond), rep.SHA256)
}
