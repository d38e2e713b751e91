package connector_test

import "golang.org/x/sys/unix"

// gettid is the calling thread's id.
func gettid() int { return unix.Gettid() }
