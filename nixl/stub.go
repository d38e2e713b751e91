//go:build !nixl && !nixlfake

package nixl

import (
	"github.com/ecxfer/ecxfer/cache"
	"github.com/ecxfer/ecxfer/xfer"
)

// Agent is a NIXL agent; in this build it cannot be made.
type Agent struct{ xfer.DataTransport }

// New returns ErrNotBuilt: this build has no NIXL.
func New(Config, *cache.Region) (*Agent, error) { return nil, ErrNotBuilt }
