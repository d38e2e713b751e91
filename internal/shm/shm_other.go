//go:build !linux

package shm

import "os"

// Create fails: a Shared region needs a sealed memfd.
func Create(int) (*os.File, error) { return nil, ErrUnsupported }

// Path is never called: no Shared region exists here.
func Path(*os.File) string { return "" }

// AdviseHuge does nothing: transparent huge pages are Linux's.
func AdviseHuge([]byte) {}
