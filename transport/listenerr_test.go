package transport

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
)

// A control-plane listen that fails names the address as given and the
// network's reason, never the guard's internal endpoint, and keeps the
// cause reachable.
func TestListenErrorNamesTheAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, addr := range []string{"127.0.0.1:99999", "tcp://" + ln.Addr().String()} {
		s, err := Listen(addr, ServerConfig{})
		if err == nil {
			s.Close()
			t.Fatalf("%s: listened", addr)
		}
		msg := err.Error()
		if strings.Contains(msg, guardScheme) || strings.Contains(msg, "zmq4") || !strings.Contains(msg, addr) {
			t.Errorf("%s: %q", addr, msg)
		}
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Errorf("%s: the network's error is not reachable: %q", addr, msg)
		}
	}
	if _, err := Listen("tcp://"+ln.Addr().String(), ServerConfig{}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("address in use: %v", err)
	}
}
