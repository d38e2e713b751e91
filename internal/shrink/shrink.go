// Package shrink gives back memory that Go's maps and slices keep after a
// burst: they never shrink by themselves.
package shrink

// Map returns m, or a copy of it sized to its entries when it was made
// for far more than it held lately (made: the most it held since made,
// reset to the copy's size).
func Map[K comparable, V any](m map[K]V, made *int, lately int) map[K]V {
	if *made < 256 || 4*lately > *made {
		return m
	}
	n := make(map[K]V, len(m))
	for k, v := range m {
		n[k] = v
	}
	*made = len(n)
	return n
}

// Slice returns s, or a copy of it with room for lately elements when its
// capacity is far beyond.
func Slice[T any](s []T, lately int) []T {
	if cap(s) <= 4*lately+64 {
		return s
	}
	n := make([]T, len(s), max(len(s), lately))
	copy(n, s)
	return n
}
