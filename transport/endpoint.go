package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// endpoint is a control-plane address: "tcp://host:port" (or "host:port"),
// or "ipc://path", a Unix-domain socket, as libzmq names them. On Linux
// "ipc://@name" is a name in the abstract namespace: no file, gone with its
// listener, reachable by any process in the same network namespace.
type endpoint struct {
	network string // "tcp" or "unix"
	addr    string // host:port, or the socket's path
}

// maxIPCPath is the longest path a Unix-domain socket address holds
// (sun_path less its terminating NUL).
const maxIPCPath = 107

// parseEndpoint accepts "tcp://host:port", "host:port" and "ipc://path".
func parseEndpoint(s string) (endpoint, error) {
	if path, ok := strings.CutPrefix(s, "ipc://"); ok {
		switch {
		case path == "" || path == "@":
			return endpoint{}, fmt.Errorf("transport: address %q: no path", s)
		case len(path) > maxIPCPath:
			return endpoint{}, fmt.Errorf("transport: address %q: the path is longer than %d bytes", s, maxIPCPath)
		case strings.IndexByte(path, 0) >= 0:
			return endpoint{}, fmt.Errorf("transport: address %q: NUL in the path", s)
		}
		return endpoint{"unix", path}, nil
	}
	hp := strings.TrimPrefix(s, "tcp://")
	if _, _, err := net.SplitHostPort(hp); err != nil {
		return endpoint{}, fmt.Errorf("transport: address %q: %w", s, err)
	}
	return endpoint{"tcp", hp}, nil
}

// String is the endpoint as Endpoint and libzmq write it.
func (e endpoint) String() string {
	if e.network == "unix" {
		return "ipc://" + e.addr
	}
	return "tcp://" + e.addr
}

// endpointOf names a bound address as an endpoint.
func endpointOf(a net.Addr) string {
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// staleLockWait bounds the wait for the lock under which a stale socket
// file is replaced.
const staleLockWait = 2 * time.Second

// listenEndpoint binds e. A socket file left by a process that is gone
// (nothing accepts on it) is removed and bound again, as libzmq does; one
// with a live listener, or a path that is not a socket, is an error.
func listenEndpoint(e endpoint) (net.Listener, error) {
	ln, err := net.Listen(e.network, e.addr)
	if err == nil || e.network != "unix" || strings.HasPrefix(e.addr, "@") || !errors.Is(err, syscall.EADDRINUSE) {
		return ln, err
	}
	// Under a lock on the directory: two of ours that both found the file
	// stale would otherwise each remove the other's new one.
	dir, derr := unix.Open(filepath.Dir(e.addr), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if derr != nil {
		return nil, err
	}
	defer unix.Close(dir)
	// Any process that can read the directory can hold its lock: wait a
	// while, not for ever.
	for end := time.Now().Add(staleLockWait); unix.Flock(dir, unix.LOCK_EX|unix.LOCK_NB) != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			return nil, err
		}
	}
	defer unix.Flock(dir, unix.LOCK_UN)
	if ln, err = net.Listen(e.network, e.addr); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		return ln, err
	}
	if fi, serr := os.Lstat(e.addr); serr != nil || fi.Mode().Type() != os.ModeSocket {
		return nil, err
	}
	c, derr := net.DialTimeout("unix", e.addr, time.Second)
	if derr == nil {
		c.Close()
		return nil, err // in use
	}
	if !errors.Is(derr, syscall.ECONNREFUSED) {
		return nil, err
	}
	if rerr := os.Remove(e.addr); rerr != nil {
		return nil, err
	}
	return net.Listen(e.network, e.addr)
}

// localHost is the host of every peer on a Unix-domain socket, for the
// limits per host: they are all this host's.
const localHost = "local"

// peerHost is the host a connection comes from.
func peerHost(c net.Conn) string {
	a := c.RemoteAddr()
	if a == nil || a.Network() == "unix" {
		return localHost
	}
	h := a.String()
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}
