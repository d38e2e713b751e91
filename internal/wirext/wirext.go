// Package wirext holds what the Go peers' extensions of the protocol add
// beyond the messages of package wire: the grant in a completion
// notification, the digest of a producer's agent metadata (ecx_known) and
// the mm_hash of a contact request (ecx_contact).
package wirext

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strconv"

	"github.com/ecxfer/ecxfer/wire"
)

// A READ's completion notification is "<session_id>:<mm_hash>", the key the
// producer matches. A Go consumer appends "#<grant>", the decimal id of the
// grant its ack carried (ecx_grant), so that the producer ends exactly
// that grant, and, when the ack carried a token (ecx_token),
// ".<token>" in 32 lowercase hex digits: the capability that lets the
// notification (and a READ that carries it) act on the grant.

// tokenHex is the length of a token in hex.
const tokenHex = 2 * len(wire.Token{})

// AppendNotifGrant appends "#<id>", and ".<token in hex>" unless token is
// zero, to a notification key.
func AppendNotifGrant(key []byte, id uint64, token wire.Token) []byte {
	key = strconv.AppendUint(append(key, '#'), id, 10)
	if token.IsZero() {
		return key
	}
	return hex.AppendEncode(append(key, '.'), token[:])
}

// SplitNotifGrant splits "<key>#<decimal id>[.<token>]"; ok is false when
// msg does not end in a grant id that fits a uint64, optionally followed by
// a token of 32 lowercase hex digits. token is zero when absent.
func SplitNotifGrant(msg []byte) (key []byte, id uint64, token wire.Token, ok bool) {
	i := bytes.LastIndexByte(msg, '#')
	if i < 0 {
		return nil, 0, token, false
	}
	num := msg[i+1:]
	if j := len(num) - tokenHex - 1; j > 0 && num[j] == '.' {
		if !lowerHex(num[j+1:]) {
			return nil, 0, token, false
		}
		hex.Decode(token[:], num[j+1:])
		if token.IsZero() {
			return nil, 0, token, false // a zero token is no token: never on the wire
		}
		num = num[:j]
	}
	if len(num) == 0 || len(num) > 20 {
		return nil, 0, wire.Token{}, false
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return nil, 0, wire.Token{}, false
		}
		next := id*10 + uint64(c-'0')
		if next < id {
			return nil, 0, wire.Token{}, false
		}
		id = next
	}
	return msg[:i], id, token, true
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ContactHash is the mm_hash of a contact request (wire.XferReq.Contact):
// not a content hash, so that a producer that does not read the
// extension holds no entry of it. A Go producer knows a contact by the
// flag alone: a request for this mm_hash without it is an ordinary one.
const ContactHash = "ecxfer-contact"

// MetaDigest is the digest of a producer's agent metadata a consumer
// sends as wire.XferReq.Known: the first 8 bytes of its SHA-256, never
// zero.
func MetaDigest(meta []byte) uint64 {
	sum := sha256.Sum256(meta)
	return binary.BigEndian.Uint64(sum[:]) | 1
}

// Ints converts a slice of ints, appending to dst.
func Ints(dst []wire.Int, vs []int) []wire.Int {
	n := len(dst)
	dst = slices.Grow(dst, len(vs))[:n+len(vs)]
	out := dst[n:]
	for i, v := range vs {
		out[i] = wire.IntOf(int64(v))
	}
	return dst
}

// Expected reports whether a NACK is part of normal operation (logged at
// info rather than warning): NACK_NOT_READY and NACK_MISSING.
func Expected(s wire.Status) bool { return s == wire.NackNotReady || s == wire.NackMissing }
