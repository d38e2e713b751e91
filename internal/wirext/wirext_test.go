package wirext

import (
	"math"
	"testing"

	"github.com/ecxfer/ecxfer/wire"
)

// A notification's grant id and token round-trip; anything but a decimal
// that fits a uint64 after the last '#', optionally followed by '.' and 32
// lowercase hex digits of a nonzero token, is no grant.
func TestNotifGrant(t *testing.T) {
	tok := wire.Token{1, 2, 3, 0xab, 15: 0xff}
	for _, id := range []uint64{0, 7, math.MaxUint64} {
		for _, want := range []wire.Token{{}, tok} {
			msg := AppendNotifGrant([]byte("s#1:m"), id, want)
			key, got, token, ok := SplitNotifGrant(msg)
			if !ok || got != id || string(key) != "s#1:m" || token != want {
				t.Fatalf("%q: %q %d %x %v", msg, key, got, token, ok)
			}
		}
	}
	hexTok := "0102030b000000000000000000000000"
	for _, msg := range []string{"s:m", "s:m#", "s:m#12a", "s:m#-1", "s:m#18446744073709551616", "s:m#000000000000000000001",
		"s:m#7." + hexTok[1:], "s:m#7." + hexTok + "0", "s:m#7.0102030B000000000000000000000000", "s:m#." + hexTok,
		"s:m#7.00000000000000000000000000000000", "s:m#7:" + hexTok} {
		if _, _, _, ok := SplitNotifGrant([]byte(msg)); ok {
			t.Fatalf("%q split", msg)
		}
	}
}

func TestMetaDigest(t *testing.T) {
	if MetaDigest(nil) == 0 || MetaDigest([]byte("a")) == MetaDigest([]byte("b")) || MetaDigest([]byte("a"))&1 != 1 {
		t.Fatal("digests")
	}
}

func TestExpected(t *testing.T) {
	for s := wire.OK; s <= wire.NackNotReady; s++ {
		want := s == wire.NackMissing || s == wire.NackNotReady
		if Expected(s) != want {
			t.Errorf("%s: Expected %v", s, !want)
		}
	}
}

func TestInts(t *testing.T) {
	if got := Ints(nil, []int{3, -4}); len(got) != 2 || got[0] != wire.IntOf(3) || got[1] != wire.IntOf(-4) {
		t.Errorf("Ints: %v", got)
	}
}
