package wire

import (
	"bytes"
	"strconv"
)

// A READ's completion notification is "<session_id>:<mm_hash>", the key the
// producer matches; a Go consumer appends "#<grant>", the decimal id of the
// grant its ack carried (ecx_grant), so that the producer ends exactly
// that grant.

// AppendNotifGrant appends "#<id>" to a notification key.
func AppendNotifGrant(key []byte, id uint64) []byte {
	return strconv.AppendUint(append(key, '#'), id, 10)
}

// SplitNotifGrant splits "<key>#<decimal id>"; ok is false when msg does
// not end in a grant id that fits a uint64.
func SplitNotifGrant(msg []byte) (key []byte, id uint64, ok bool) {
	i := bytes.LastIndexByte(msg, '#')
	if i < 0 || i == len(msg)-1 || len(msg)-i > 21 {
		return nil, 0, false
	}
	for _, c := range msg[i+1:] {
		if c < '0' || c > '9' {
			return nil, 0, false
		}
		next := id*10 + uint64(c-'0')
		if next < id {
			return nil, 0, false
		}
		id = next
	}
	return msg[:i], id, true
}
