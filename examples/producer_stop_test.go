package examples_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// An interrupted producer says it is stopping, then what it served, and
// exits 0.
func TestProducerSaysItIsStopping(t *testing.T) {
	prod := exec.Command(build(t, "producer"), "-control", "127.0.0.1:0", "-data-addr", "127.0.0.1:0", "-items", "4")
	out, err := prod.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	prod.Stderr = &stderr
	if err := prod.Start(); err != nil {
		t.Fatal(err)
	}
	defer prod.Process.Kill()
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("producer said %q: %v", line, err)
	}
	prod.Process.Signal(syscall.SIGINT)
	rest, _ := r.ReadString(0)
	if err := prod.Wait(); err != nil {
		t.Fatalf("producer exit: %v\n%s", err, stderr.String())
	}
	if stderr.String() != "producer: stopping\n" || !strings.Contains(rest, "producer: 0 requests") {
		t.Fatalf("stderr %q, stdout %q", stderr.String(), rest)
	}
}
