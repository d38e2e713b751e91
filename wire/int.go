package wire

import (
	"math"
	"strconv"
)

// Int is a Python int as msgspec carries it, in [-2^63, 2^64-1]; zero is 0.
type Int struct {
	u   uint64 // the value; two's complement when neg
	neg bool
}

// IntOf returns v as an Int.
func IntOf(v int64) Int { return Int{u: uint64(v), neg: v < 0} }

// UintOf returns v as an Int.
func UintOf(v uint64) Int { return Int{u: v} }

// Int64 returns the value and whether it fits in an int64.
func (i Int) Int64() (int64, bool) {
	if !i.neg && i.u > math.MaxInt64 {
		return 0, false
	}
	return int64(i.u), true
}

// Uint64 returns the value and whether it fits in a uint64 (is not negative).
func (i Int) Uint64() (uint64, bool) { return i.u, !i.neg }

// Int returns the value and whether it fits in an int.
func (i Int) Int() (int, bool) {
	v, ok := i.Int64()
	if !ok || int64(int(v)) != v {
		return 0, false
	}
	return int(v), true
}

// String returns the value in decimal.
func (i Int) String() string {
	if i.neg {
		return strconv.FormatInt(int64(i.u), 10)
	}
	return strconv.FormatUint(i.u, 10)
}
