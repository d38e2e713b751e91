package transport

import (
	"fmt"
	"os"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/ecxfer/ecxfer/internal/shm"
	"github.com/ecxfer/ecxfer/xfer"
)

// Metadata naming a file that is not a producer's region (one of this
// process's own, say, from a hostile producer on another host) is not
// mapped; nor is a region file whose size is not sealed: shrunk under a
// copy, it would fault the consumer (SIGBUS). The READs go over TCP.
func TestSharedRefusesOtherFiles(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := unix.MemfdCreate(shm.FileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	unsealed := os.NewFile(uintptr(fd), "unsealed")
	defer unsealed.Close()
	for _, f := range []*os.File{f, unsealed} {
		t.Run(f.Name(), func(t *testing.T) { refusesFile(t, f) })
	}
}

func refusesFile(t *testing.T, f *os.File) {
	f.Write(make([]byte, shm.HeaderSize()+8*4096))
	pr := newRegion(t, 8, 4096) // not shared: its metadata names no file
	p := newTCP(t, pr, TCPConfig{Listen: "127.0.0.1:0", Authorize: allowAll})
	var m agentMeta
	if err := msgpack.Unmarshal(p.AgentMetadata(), &m); err != nil {
		t.Fatal(err)
	}
	m.Shm, m.ShmOff = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd()), shm.HeaderSize()
	meta, _ := msgpack.Marshal(&m)
	c := newTCP(t, newRegion(t, 8, 4096), TCPConfig{})
	peer, err := c.AddRemotePeer(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	mapped := c.peers[peer.Agent].sh != nil
	c.mu.Unlock()
	if mapped {
		t.Fatal("mapped a file that is not a shared region")
	}
	h, err := c.PostRead([]int{0}, peer.Agent, []int{3}, []byte("s:m"))
	if err != nil {
		t.Fatal(err)
	}
	if waitEnd(t, c, h) != xfer.Complete || c.Stats().BoardCopies != 0 {
		t.Fatal("the READ did not go over TCP")
	}
}
