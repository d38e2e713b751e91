//go:build nixl

package nixl

import (
	"errors"
	"os"
	"testing"
)

// Real NIXL over UCX's TCP and shared-memory transports (the latter needs
// the error handling mode none, see the README).
var variants = []variant{
	{name: "tcp", tls: "tcp"},
	{name: "sm", tls: "sm", params: map[string]string{"ucx_error_handling_mode": "none"}},
}

// needNIXL skips a test when this build compiled the stub (no nixl.h), and
// fails it under CI=true, where NIXL must be there.
func needNIXL(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrNotBuilt) {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but NIXL is missing: %v", err)
	}
	t.Skipf("no NIXL in this build; to run these tests: export PKG_CONFIG_PATH=$PWD/../shared/nixl/lib/pkgconfig; "+
		`CGO_CPPFLAGS="$(pkg-config --cflags nixl)" CGO_LDFLAGS="$(pkg-config --libs nixl)" go test -tags nixl ./nixl/ (%v)`, err)
}
