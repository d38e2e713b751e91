//go:build !linux

package connector_test

// gettid is 0 where threads have no id to ask for: a goroutine moved to
// another thread during its share goes unseen.
func gettid() int { return 0 }
