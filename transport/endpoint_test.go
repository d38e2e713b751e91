package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ecxfer/ecxfer/xfer"
)

func TestParseEndpoint(t *testing.T) {
	long := "ipc:///" + strings.Repeat("a", maxIPCPath)
	for _, tc := range []struct {
		in, network, addr string
		ok                bool
	}{
		{"tcp://127.0.0.1:5555", "tcp", "127.0.0.1:5555", true},
		{"127.0.0.1:5555", "tcp", "127.0.0.1:5555", true},
		{"tcp://[::1]:0", "tcp", "[::1]:0", true},
		{"ipc:///run/ecxfer/producer.sock", "unix", "/run/ecxfer/producer.sock", true},
		{"ipc://relative.sock", "unix", "relative.sock", true},
		{"ipc://@ecxfer-producer", "unix", "@ecxfer-producer", true},
		{long[:len("ipc://")+maxIPCPath], "unix", long[len("ipc://") : len("ipc://")+maxIPCPath], true},
		{long, "", "", false},
		{"ipc://", "", "", false},
		{"ipc://@", "", "", false},
		{"ipc://a\x00b", "", "", false},
		{"tcp://no-port", "", "", false},
		{"udp://127.0.0.1:5555", "", "", false},
		{"", "", "", false},
	} {
		e, err := parseEndpoint(tc.in)
		if (err == nil) != tc.ok || e.network != tc.network || e.addr != tc.addr {
			t.Errorf("%q: %+v, %v", tc.in, e, err)
			continue
		}
		if tc.ok && tc.network == "unix" && e.String() != tc.in {
			t.Errorf("%q written back as %q", tc.in, e.String())
		}
	}
}

// ipcAddrs are the Unix-domain endpoints this OS offers a test: a file,
// and on Linux a name in the abstract namespace.
func ipcAddrs(t *testing.T) []string {
	addrs := []string{"ipc://" + filepath.Join(t.TempDir(), "ctl.sock")}
	if runtime.GOOS == "linux" {
		addrs = append(addrs, fmt.Sprintf("ipc://@ecxfer-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	}
	return addrs
}

func newServerAt(t testing.TB, addr string, cfg ServerConfig) *Server {
	t.Helper()
	cfg.Logger = quiet
	s, err := Listen(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Over a Unix-domain socket the control plane is the one over TCP: the
// endpoint reads back as given, requests and replies arrive in order, and
// a socket file is gone once the server closes.
func TestIPCRoundTrip(t *testing.T) {
	for _, addr := range ipcAddrs(t) {
		t.Run(addr, func(t *testing.T) {
			s := newServerAt(t, addr, ServerConfig{})
			if s.Endpoint() != addr {
				t.Fatalf("endpoint %q, listened on %q", s.Endpoint(), addr)
			}
			stop := make(chan struct{})
			done := echo(t, s, stop)
			c := newClient(t, ClientConfig{})
			for i := range 100 {
				if err := c.Send(addr, fmt.Appendf(nil, "m%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			got := waitInbound(t, c, 100, 10*time.Second)
			for i, m := range got {
				if m.Addr != addr || string(m.Payload) != fmt.Sprintf("re:m%d", i) {
					t.Fatalf("reply %d: %+v", i, m)
				}
			}
			close(stop)
			<-done
			c.Close()
			s.Close()
			if path := strings.TrimPrefix(addr, "ipc://"); path[0] != '@' {
				if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("socket file after Close: %v", err)
				}
			}
		})
	}
}

// staleSocket leaves a socket file at path that nothing accepts on, as a
// process that died would, and returns path.
func staleSocket(t *testing.T, path string) string {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	return path
}

// A socket file nothing accepts on (its process died) is bound over, as
// libzmq does; one a live server holds, or a path that is not a socket,
// is never touched.
func TestIPCListenOverAStaleFile(t *testing.T) {
	dir := t.TempDir()
	stale := staleSocket(t, filepath.Join(dir, "stale.sock"))
	if _, err := os.Lstat(stale); err != nil {
		t.Fatalf("the stale file is not there: %v", err)
	}
	newServerAt(t, "ipc://"+stale, ServerConfig{})

	if _, err := Listen("ipc://"+stale, ServerConfig{Logger: quiet}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("a live server's path: %v", err)
	}
	c := newClient(t, ClientConfig{})
	if err := c.Connect(t.Context(), "ipc://"+stale); err != nil {
		t.Fatalf("the live server after a second Listen failed: %v", err)
	}

	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("ipc://"+plain, ServerConfig{Logger: quiet}); err == nil || !strings.Contains(err.Error(), plain) {
		t.Fatalf("a regular file's path: %v", err)
	}
	if b, err := os.ReadFile(plain); err != nil || string(b) != "keep" {
		t.Fatalf("the regular file: %q, %v", b, err)
	}
}

// Every peer on a Unix-domain socket is this host's, whatever name it
// binds its end to: together they hold at most MaxConnsPerHost
// connections, and a newcomer sheds the idlest.
func TestIPCConnsShareTheLocalHost(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ctl.sock")
	s := newServerAt(t, "ipc://"+path, ServerConfig{MaxConnsPerHost: 2})
	n := 0
	dial := func() net.Conn {
		n++
		return dialGreet(t, net.Dialer{LocalAddr: &net.UnixAddr{Net: "unix", Name: filepath.Join(dir, fmt.Sprint("peer", n))}}, "unix", path)
	}
	a, b := dial(), dial()
	ready(t, s, a, "a")
	ready(t, s, b, "b")
	request(t, s, a, "a")
	c := dial()
	ready(t, s, c, "c")
	expectClosed(t, b, 5*time.Second)
	if st := s.Stats(); st.Shed != 1 {
		t.Fatalf("shed %d, want 1", st.Shed)
	}
	for _, id := range []string{"a", "c"} {
		if err := s.Reply([]byte(id), []byte("still here")); err != nil {
			t.Fatalf("reply to %s: %v", id, err)
		}
	}
}

// A Client's Allow sees an ipc endpoint whole, so a list of host:port
// pairs admits none.
func TestClientAllowSeesIPCWhole(t *testing.T) {
	var seen []string
	c := newClient(t, ClientConfig{Allow: func(a string) bool { seen = append(seen, a); return false }})
	for _, addr := range []string{"ipc:///tmp/x.sock", "tcp://127.0.0.1:1"} {
		if err := c.Send(addr, []byte("x")); !errors.Is(err, xfer.ErrNotAllowed) {
			t.Fatalf("%s: %v", addr, err)
		}
	}
	if len(seen) != 2 || seen[0] != "ipc:///tmp/x.sock" || seen[1] != "127.0.0.1:1" {
		t.Fatalf("Allow saw %q", seen)
	}
}

// Two servers starting at once over one stale socket file: one binds,
// the other fails; never both, which would leave the first unreachable.
func TestIPCConcurrentListensOverAStaleFile(t *testing.T) {
	both := 0
	for range 200 {
		path := staleSocket(t, filepath.Join(t.TempDir(), "ctl.sock"))
		var wg sync.WaitGroup
		var lns [2]net.Listener
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lns[k], _ = listenEndpoint(endpoint{"unix", path})
			}()
		}
		wg.Wait()
		if lns[0] != nil && lns[1] != nil {
			both++
		}
		for _, l := range lns {
			if l != nil {
				l.Close()
			}
		}
	}
	if both > 0 {
		t.Fatalf("%d of 200: both listens succeeded on one path", both)
	}
}
