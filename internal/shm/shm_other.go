//go:build !linux

package shm

import "os"

// Create fails: a Shared region needs a sealed memfd.
func Create(int) (*os.File, error) { return nil, ErrUnsupported }

// Path is never called: no Shared region exists here.
func Path(*os.File) string { return "" }

// AdviseHuge does nothing: transparent huge pages are Linux's.
func AdviseHuge([]byte) {}

// Sealed fails: no file is a Shared region here.
func Sealed(*os.File) error { return ErrUnsupported }

// PopulateRead fails: the pages are faulted in by their first use.
func PopulateRead([]byte) error { return ErrUnsupported }
