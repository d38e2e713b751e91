package connector_test

import (
	"os/exec"
	"strings"
	"testing"
)

// An engine that brings its own control plane links no zmq4 and no msgpack
// through connector.
func TestLinksNoControlPlane(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "zmq4") || strings.Contains(dep, "msgpack") || strings.HasSuffix(dep, "ecxfer/transport") {
			t.Errorf("connector links %s", dep)
		}
	}
}
