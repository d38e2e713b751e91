package transport

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const python = "/usr/bin/python3"

// requirePyzmq skips when the real libzmq (Debian's python3-zmq) is missing,
// except in CI, where it must be there.
func requirePyzmq(t testing.TB) {
	t.Helper()
	if err := exec.Command(python, "-c", "import zmq").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI needs %s with python3-zmq: %v", python, err)
		}
		t.Skipf("interop test skipped: %s with python3-zmq not available (apt-get install python3-zmq): %v", python, err)
	}
}

func pyScript(name string) string { return filepath.Join("testdata", name) }

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startPyRouter runs the pyzmq ROUTER echo on addr (host:port, or an
// endpoint) and waits until it is bound.
func startPyRouter(t testing.TB, addr string) *exec.Cmd {
	t.Helper()
	if !strings.Contains(addr, "://") {
		addr = "tcp://" + addr
	}
	cmd := exec.Command(python, pyScript("py_router_echo.py"), addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("pyzmq ROUTER did not start: %q %v", line, err)
	}
	return cmd
}

// (1) A pyzmq DEALER with the reference's heartbeat options, scaled down
// (interval 250 ms, timeout 500 ms, TTL 1 s), talks to our server, idles for
// four heartbeat timeouts and sees no disconnect.
func TestInteropPyDealerHeartbeat(t *testing.T) {
	requirePyzmq(t)
	// Our own PINGs would also keep libzmq content: make them rare, so that
	// only the PONGs to its PINGs can.
	s := newServer(t, ServerConfig{PingInterval: time.Minute, PeerTimeout: 2 * time.Minute})
	stop := make(chan struct{})
	defer close(stop)
	echo(t, s, stop)
	out, err := exec.Command(python, pyScript("py_dealer_heartbeat.py"), s.Endpoint(), "250", "500", "1000", "2.2").Output()
	if err != nil {
		t.Fatalf("pyzmq DEALER: %v", err)
	}
	var res struct {
		Disconnects int        `json:"disconnects"`
		Replies     [][]string `json:"replies"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if res.Disconnects != 0 {
		t.Fatalf("%d disconnect events while idle", res.Disconnects)
	}
	want := [][]string{{"", "re:one"}, {"", "re:two"}}
	if fmt.Sprint(res.Replies) != fmt.Sprint(want) {
		t.Fatalf("replies %q, want %q", res.Replies, want)
	}
	if st := s.Stats(); st.Malformed != 0 || st.Received != 2 {
		t.Fatalf("a heartbeat reached the application: %+v", st)
	}
}

// Over Unix-domain sockets libzmq and we speak as over TCP, both ways: a
// pyzmq DEALER (the reference's heartbeat options) to our server, and our
// client to a pyzmq ROUTER, on a file and, on Linux, an abstract name.
func TestInteropIPC(t *testing.T) {
	requirePyzmq(t)
	for _, addr := range ipcAddrs(t) {
		t.Run(addr, func(t *testing.T) {
			s := newServerAt(t, addr, ServerConfig{})
			stop := make(chan struct{})
			defer close(stop)
			echo(t, s, stop)
			out, err := exec.Command(python, pyScript("py_dealer_heartbeat.py"), addr, "250", "500", "1000", "0.3").Output()
			if err != nil {
				t.Fatalf("pyzmq DEALER: %v", err)
			}
			if !strings.Contains(string(out), `"replies": [["", "re:one"], ["", "re:two"]]`) {
				t.Fatalf("pyzmq DEALER saw %s", out)
			}
			if st := s.Stats(); st.Malformed != 0 || st.Received != 2 {
				t.Fatalf("stats %+v", st)
			}
			s.Close()

			startPyRouter(t, addr)
			c := newClient(t, ClientConfig{})
			for _, p := range []string{"a", "b"} {
				if err := c.Send(addr, []byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			got := waitInbound(t, c, 2, 10*time.Second)
			if string(got[0].Payload) != "re:a" || string(got[1].Payload) != "re:b" || got[0].Addr != addr {
				t.Fatalf("replies %+v", got)
			}
		})
	}
}

// A libzmq ROUTER (vLLM's producer) drops the same-host query, a command
// it does not know: requests and replies go on over TCP, nothing fails.
func TestInteropPyRouterIgnoresSameHostQuery(t *testing.T) {
	requirePyzmq(t)
	addr := freePort(t)
	startPyRouter(t, addr)
	c := newClient(t, ClientConfig{})
	start := time.Now()
	if err := c.Connect(t.Context(), "tcp://"+addr); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Connect took %v: it waited for an offer a libzmq producer never makes", took)
	}
	for i := range 5 {
		if err := c.Send("tcp://"+addr, fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
		if got := waitInbound(t, c, 1, 10*time.Second); string(got[0].Payload) != fmt.Sprintf("re:m%d", i) {
			t.Fatalf("reply %d: %q", i, got[0].Payload)
		}
	}
	if st := c.Stats(); st.SameHost != 0 || st.SameHostFailed != 0 || st.Malformed != 0 {
		t.Fatalf("stats %+v", st)
	}
	c.mu.Lock()
	asked := c.peers["tcp://"+addr].asked.Load()
	c.mu.Unlock()
	if !asked {
		t.Fatal("the query was not sent: the test shows nothing")
	}
	if d := c.Dead(nil); len(d) != 0 {
		t.Fatalf("dead: %v", d)
	}
}

// (2) Our client talks to a pyzmq ROUTER; killed, it is reported dead;
// restarted on the same port, a new request succeeds.
func TestInteropPyRouterKillRestart(t *testing.T) {
	requirePyzmq(t)
	addr := freePort(t)
	ep := "tcp://" + addr
	py := startPyRouter(t, addr)
	c := newClient(t, ClientConfig{})
	if err := c.Send(ep, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if got := waitInbound(t, c, 1, 5*time.Second); string(got[0].Payload) != "re:a" {
		t.Fatalf("%q", got[0].Payload)
	}
	py.Process.Kill()
	py.Wait()
	if a, d := waitDead(t, c, 5*time.Second); a != ep || d > time.Second {
		t.Fatalf("dead %q after %v", a, d)
	}
	startPyRouter(t, addr)
	if err := c.Send(ep, []byte("b")); err != nil {
		t.Fatal(err)
	}
	if got := waitInbound(t, c, 1, 5*time.Second); string(got[0].Payload) != "re:b" {
		t.Fatalf("%q", got[0].Payload)
	}
}

// (3) A SIGSTOPped pyzmq ROUTER is reported dead within the silence
// timeout.
func TestInteropPyRouterStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out silence timeouts: 5 s")
	}
	t.Parallel() // mostly waits: beside the other waiting tests
	requirePyzmq(t)
	addr := freePort(t)
	ep := "tcp://" + addr
	py := startPyRouter(t, addr)
	const silence = time.Second
	c := newClient(t, ClientConfig{PingInterval: 200 * time.Millisecond, PeerTimeout: silence})
	c.Send(ep, []byte("a"))
	waitInbound(t, c, 1, 5*time.Second)
	// Live but idle for three silence timeouts: not dead (PONGs count).
	time.Sleep(3 * silence)
	if d := c.Dead(nil); len(d) != 0 {
		t.Fatalf("idle live peer reported dead: %v", d)
	}
	py.Process.Signal(syscall.SIGSTOP)
	if a, d := waitDead(t, c, 5*silence); a != ep || d > silence+500*time.Millisecond {
		t.Fatalf("dead %q after %v", a, d)
	}
}
