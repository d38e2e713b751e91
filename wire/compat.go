package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"unicode/utf8"
)

// CompatHash returns the hash producer and consumer compare, as vLLM does.
func CompatHash(vllmVersion, model, dtype string, blockSizeBytes int) string {
	var buf [256]byte
	b := append(buf[:0], '[')
	b = appendPyJSONStr(b, vllmVersion)
	b = append(b, ',')
	b = appendPyJSONStr(b, model)
	b = append(b, ',')
	b = appendPyJSONStr(b, dtype)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(blockSizeBytes), 10)
	b = append(b, ']')
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

const hexDigits = "0123456789abcdef"

// appendPyJSONStr appends s as a JSON string the way Python's json module
// does with ensure_ascii on.
func appendPyJSONStr(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			b = append(b, c)
			i++
			continue
		}
		if c < utf8.RuneSelf {
			i++
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default: // other controls and DEL
				b = appendU(b, rune(c))
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if r > 0xffff {
			r -= 0x10000
			b = appendU(b, 0xd800+(r>>10))
			b = appendU(b, 0xdc00+(r&0x3ff))
		} else {
			b = appendU(b, r)
		}
	}
	return append(b, '"')
}

func appendU(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}
