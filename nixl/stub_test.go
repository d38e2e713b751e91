//go:build !nixl && !nixlfake

package nixl

import (
	"errors"
	"strings"
	"testing"
)

func TestNotBuilt(t *testing.T) {
	_, err := New(Config{Name: "x"}, nil)
	if !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("New: %v", err)
	}
	// How to build with the tag, how the binary finds NIXL, and where
	// the whole recipe is.
	for _, want := range []string{"-tags nixl", `CGO_LDFLAGS="-Wl,-rpath,$NIXL/lib"`, "docs/nixl.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
