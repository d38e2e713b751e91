//go:build !nixl && !nixlfake

package nixl

import (
	"errors"
	"testing"
)

func TestNotBuilt(t *testing.T) {
	if _, err := New(Config{Name: "x"}, nil); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("New: %v", err)
	}
}
