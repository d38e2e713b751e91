//go:build !linux

package transport

import (
	"fmt"
	"os"
)

// openRegionFile fails: same-host copies are Linux's.
func openRegionFile(path string) (*os.File, error) {
	return nil, fmt.Errorf("%w: %s: no shared regions on this system", errBadMeta, path)
}

// dataExtents calls f with none: no shared regions here.
func dataExtents(fd, size int, f func(lo, hi int) bool) {}
