//go:build nixlfake

package nixl

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ecxfer/ecxfer/cache"
)

// newFailing has the fake fail the next agent's creation with status st
// and returns New's error.
func newFailing(t *testing.T, cfg Config, st int) error {
	t.Helper()
	r, err := cache.NewRegion(cache.RegionConfig{Blocks: 4, BlockSize: 64, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fakeFail(fakeNew, st, 1)
	defer fakeFail(0, 0, 0)
	if cfg.Name == "" {
		cfg.Name = "failing"
	}
	a, err := New(cfg, r)
	if err == nil {
		a.Close()
		t.Fatal("New made an agent the fake was to refuse")
	}
	return err
}

// pluginDir gives the fake a libnixl.so folder whose plugins/ holds the
// UCX plugin, and returns the folder.
func pluginDir(t *testing.T, withUCX bool) string {
	t.Helper()
	dir := t.TempDir()
	if withUCX {
		if err := os.MkdirAll(filepath.Join(dir, "plugins"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "plugins", "libplugin_UCX.so"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fakeSetNixlDir(dir)
	t.Cleanup(func() { fakeSetNixlDir("") })
	return dir
}

// UCX's shared-memory transports fail backend creation in UCX's default
// error handling mode: the error names the backend parameter to add.
func TestSharedMemoryWithoutErrorModeNamesTheParameter(t *testing.T) {
	pluginDir(t, true)
	t.Setenv("NIXL_PLUGIN_DIR", "")
	t.Setenv("UCX_TLS", "sm")
	err := newFailing(t, Config{}, -3)
	if !errors.Is(err, errBackend) || !strings.Contains(err.Error(), "UCX_TLS=sm needs the backend parameter ucx_error_handling_mode=none") {
		t.Fatalf("New: %v", err)
	}
	// With the parameter there, the failure is something else.
	err = newFailing(t, Config{Params: map[string]string{"ucx_error_handling_mode": "none"}}, -3)
	if strings.Contains(err.Error(), "ucx_error_handling_mode") {
		t.Fatalf("New with the parameter: %v", err)
	}
}

// A backend plugin NIXL cannot find: the error says where NIXL looks.
func TestMissingPluginSaysWhereNIXLLooks(t *testing.T) {
	dir := pluginDir(t, false)
	t.Setenv("NIXL_PLUGIN_DIR", "")
	t.Setenv("UCX_TLS", "sm") // the plugin comes first
	err := newFailing(t, Config{}, -3)
	want := "no libplugin_UCX.so in " + filepath.Join(dir, "plugins") + " (plugins/ beside libnixl.so; NIXL_PLUGIN_DIR unset)"
	if !errors.Is(err, errBackend) || !strings.Contains(err.Error(), want) {
		t.Fatalf("New: %v\nwant it to say %q", err, want)
	}
	// NIXL_PLUGIN_DIR, when set, is the only folder NIXL looks in.
	other := t.TempDir()
	t.Setenv("NIXL_PLUGIN_DIR", other)
	err = newFailing(t, Config{}, -3)
	if want := "no libplugin_UCX.so in " + other + " (NIXL_PLUGIN_DIR)"; !strings.Contains(err.Error(), want) {
		t.Fatalf("New: %v\nwant it to say %q", err, want)
	}
}

// A peer whose metadata NIXL's backend cannot load (an unreachable
// address): the error says so, with the peer's agent name and UCX_TLS.
func TestUnreachablePeerSaysWhat(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	c, _ := newAgent(t, variants[0], 8, 64, Config{Progress: ProgressCaller})
	p, _ := newAgent(t, variants[0], 8, 64, Config{Progress: ProgressCaller})
	fakeFail(fakeLoad, -3, 1)
	defer fakeFail(0, 0, 0)
	_, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if !errors.Is(err, errBackend) ||
		!strings.Contains(err.Error(), "could not reach the peer agent ") ||
		!strings.Contains(err.Error(), "at the transport address its metadata names (UCX_TLS=tcp)") {
		t.Fatalf("load: %v", err)
	}
	// The name, from metadata as NIXL writes it.
	if got := peerAgentName(nixlStyleMD("producer-7")); got != `"producer-7"` {
		t.Errorf("peerAgentName: %s", got)
	}
}

// nixlStyleMD is metadata as NIXL serializes an agent's name.
func nixlStyleMD(name string) []byte {
	b := append([]byte("nixlSerDes|Agent"), binary.LittleEndian.AppendUint64(nil, uint64(len(name)))...)
	return append(append(b, name...), "|t..."...)
}

// A name a peer's metadata cannot make into anything but a placeholder.
func TestPeerAgentNameOfBadMetadata(t *testing.T) {
	for _, md := range [][]byte{nil, []byte("Agent"), []byte("Agent\xff\xff\xff\xff\xff\xff\xff\xffx"), []byte("Agent\x05\x00\x00\x00\x00\x00\x00\x00ab")} {
		if got := peerAgentName(md); got != "(name unreadable)" {
			t.Errorf("%q: %s", md, got)
		}
	}
}

// NIXL could not make a READ's request: the error says the blocks are
// outside the registrations.
func TestNotRegisteredSaysSo(t *testing.T) {
	c, _ := newAgent(t, variants[0], 8, 64, Config{Progress: ProgressCaller})
	p, _ := newAgent(t, variants[0], 8, 64, Config{Progress: ProgressCaller})
	peer, err := c.AddRemotePeer(p.AgentMetadata(), p.MemDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	fakeFail(fakePost, -1001, 1)
	defer fakeFail(0, 0, 0)
	_, err = c.PostRead([]int{1}, peer.Agent, []int{1}, nil)
	if !errors.Is(err, errNotMade) || !strings.Contains(err.Error(), "not all in memory the two agents registered") {
		t.Fatalf("post: %v", err)
	}
}
