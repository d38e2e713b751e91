package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Sentinel errors; every decode error wraps exactly one of them.
var (
	ErrMalformed = errors.New("wire: malformed msgpack") // msgspec's DecodeError
	ErrInvalid   = errors.New("wire: invalid message")   // ValidationError: a wrong shape
)

// decodeError describes why bytes were refused. Its text is msgspec's for the
// same input where msgspec raises a DecodeError or ValidationError.
type decodeError struct {
	Kind error  // ErrMalformed or ErrInvalid
	Msg  string // e.g. "Expected `int`, got `str` - at `$.status`"
}

func (e *decodeError) Error() string { return e.Msg }
func (e *decodeError) Unwrap() error { return e.Kind }

// maxDepth bounds container nesting inside an unknown field's value. msgspec
// recurses and fails at Python's recursion limit: about 996 levels when called
// from a shallow stack, about 500 from an engine's deeper one. No message of
// the protocol nests more than two levels.
const maxDepth = 500

var errTruncated = &decodeError{ErrMalformed, "Input data was truncated"}

func malformed(format string, args ...any) error {
	return &decodeError{ErrMalformed, "MessagePack data is malformed: " + fmt.Sprintf(format, args...)}
}

func invalid(format string, args ...any) error {
	return &decodeError{ErrInvalid, fmt.Sprintf(format, args...)}
}

// at formats msgspec's location suffix.
func at(path string) string {
	if path == "" {
		return ""
	}
	return " - at `" + path + "`"
}

func expected(want string, got byte, path string) error {
	return invalid("Expected `%s`, got `%s`%s", want, typeName(got, false), at(path))
}

// typeName is msgspec's name for the type whose first byte is b. msgspec says
// "null" for a nil tag or key and "None" for a nil field value.
func typeName(b byte, nilAsNull bool) string {
	switch {
	case b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3):
		return "int"
	case b <= 0x8f || b == 0xde || b == 0xdf:
		return "object"
	case b <= 0x9f || b == 0xdc || b == 0xdd:
		return "array"
	case b <= 0xbf || (b >= 0xd9 && b <= 0xdb):
		return "str"
	case b == 0xc0:
		if nilAsNull {
			return "null"
		}
		return "None"
	case b == 0xc2 || b == 0xc3:
		return "bool"
	case b >= 0xc4 && b <= 0xc6:
		return "bytes"
	case b == 0xca || b == 0xcb:
		return "float"
	default: // c7-c9, d4-d8; c1 never gets here
		return "ext"
	}
}

func isStr(b byte) bool   { return (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb) }
func isInt(b byte) bool   { return b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3) }
func isArray(b byte) bool { return (b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd }
func isMap(b byte) bool   { return (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf }
func isBin(b byte) bool   { return b >= 0xc4 && b <= 0xc6 }

// span is a byte range of the input.
type span struct{ lo, hi int }

// reader walks one msgpack buffer. It never allocates in proportion to a
// declared length: every length is checked against what is left first.
type reader struct {
	b []byte
	i int
}

// peek returns the type byte of the next value without consuming it.
func (r *reader) peek() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.i]
	if c == 0xc1 {
		return 0, malformed("invalid opcode '\\xc1' (byte %d)", r.i)
	}
	return c, nil
}

// take consumes n bytes.
func (r *reader) take(n uint64) ([]byte, error) {
	if n > uint64(len(r.b)-r.i) {
		return nil, errTruncated
	}
	s := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return s, nil
}

// length reads the big-endian length of size bytes that follows a type byte.
func (r *reader) length(size int) (uint64, error) {
	s, err := r.take(uint64(size))
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	default:
		return uint64(binary.BigEndian.Uint32(s)), nil
	}
}

// strBody consumes a str whose type byte c was peeked and returns its bytes.
func (r *reader) strBody(c byte) (span, error) {
	r.i++
	var n uint64
	var err error
	switch c {
	case 0xd9:
		n, err = r.length(1)
	case 0xda:
		n, err = r.length(2)
	case 0xdb:
		n, err = r.length(4)
	default:
		n = uint64(c & 0x1f)
	}
	if err != nil {
		return span{}, err
	}
	lo := r.i
	if _, err := r.take(n); err != nil {
		return span{}, err
	}
	return span{lo, r.i}, nil
}

// binBody consumes a bin whose type byte c was peeked.
func (r *reader) binBody(c byte) (span, error) {
	r.i++
	n, err := r.length(1 << (c - 0xc4))
	if err != nil {
		return span{}, err
	}
	lo := r.i
	if _, err := r.take(n); err != nil {
		return span{}, err
	}
	return span{lo, r.i}, nil
}

// containerLen consumes an array or map header whose type byte c was peeked
// and returns its element count (entries for a map).
func (r *reader) containerLen(c byte) (uint64, error) {
	r.i++
	switch c {
	case 0xdc, 0xde:
		return r.length(2)
	case 0xdd, 0xdf:
		return r.length(4)
	default:
		return uint64(c & 0x0f), nil
	}
}

// intBody consumes an integer whose type byte c was peeked.
func (r *reader) intBody(c byte) (Int, error) {
	r.i++
	switch {
	case c <= 0x7f:
		return Int{u: uint64(c)}, nil
	case c >= 0xe0:
		return IntOf(int64(int8(c))), nil
	}
	size := 1 << ((c - 0xcc) & 3)
	s, err := r.take(uint64(size))
	if err != nil {
		return Int{}, err
	}
	var u uint64
	switch size {
	case 1:
		u = uint64(s[0])
	case 2:
		u = uint64(binary.BigEndian.Uint16(s))
	case 4:
		u = uint64(binary.BigEndian.Uint32(s))
	default:
		u = binary.BigEndian.Uint64(s)
	}
	if c <= 0xcf {
		return UintOf(u), nil
	}
	switch size { // signed forms: sign-extend
	case 1:
		return IntOf(int64(int8(u))), nil
	case 2:
		return IntOf(int64(int16(u))), nil
	case 4:
		return IntOf(int64(int32(u))), nil
	default:
		return IntOf(int64(u)), nil
	}
}

// readInt reads an integer value, refusing every other type.
func (r *reader) readInt(path func() string) (Int, error) {
	v, c, err := r.int()
	if err == errNotInt {
		return Int{}, expected("int", c, path())
	}
	return v, err
}

// errNotInt is int's answer for another type; the caller names the place.
var errNotInt = errors.New("not an int")

// int reads an integer value; for another type it returns errNotInt and
// the type byte, so that hot loops build an error path only on failure.
func (r *reader) int() (Int, byte, error) {
	c, err := r.peek()
	if err != nil {
		return Int{}, 0, err
	}
	if !isInt(c) {
		return Int{}, c, errNotInt
	}
	v, err := r.intBody(c)
	return v, c, err
}

// readStr reads a str value that must be valid UTF-8.
func (r *reader) readStr(path string) (span, error) {
	// The protocol's strings are fixstr or str8 and ASCII: those whole in
	// the buffer are read here, anything else below, where every error is
	// made.
	if i := r.i; i+1 < len(r.b) {
		lo, n := i+1, 0
		switch c := r.b[i]; {
		case c&0xe0 == 0xa0:
			n = int(c & 0x1f)
		case c == 0xd9:
			lo, n = i+2, int(r.b[i+1])
		default:
			lo = -1
		}
		if lo > 0 && lo+n <= len(r.b) && ascii(r.b[lo:lo+n]) {
			r.i = lo + n
			return span{lo, lo + n}, nil
		}
	}
	return r.readStrSlow(path)
}

func (r *reader) readStrSlow(path string) (span, error) {
	c, err := r.peek()
	if err != nil {
		return span{}, err
	}
	if !isStr(c) {
		return span{}, expected("str", c, path)
	}
	s, err := r.strBody(c)
	if err != nil {
		return span{}, err
	}
	if err := checkUTF8(r.b[s.lo:s.hi], path); err != nil {
		return span{}, err
	}
	return s, nil
}

// readBin reads a bin value.
func (r *reader) readBin(path string) (span, error) {
	// bin8 and bin16 whole in the buffer are read here, the rest below.
	if i := r.i; i+2 < len(r.b) {
		lo, n := -1, 0
		switch r.b[i] {
		case 0xc4:
			lo, n = i+2, int(r.b[i+1])
		case 0xc5:
			lo, n = i+3, int(binary.BigEndian.Uint16(r.b[i+1:]))
		}
		if lo > 0 && lo+n <= len(r.b) {
			r.i = lo + n
			return span{lo, lo + n}, nil
		}
	}
	return r.readBinSlow(path)
}

func (r *reader) readBinSlow(path string) (span, error) {
	c, err := r.peek()
	if err != nil {
		return span{}, err
	}
	if !isBin(c) {
		return span{}, expected("bytes", c, path)
	}
	return r.binBody(c)
}

// checkUTF8 refuses what Python's UTF-8 decoder refuses, surrogates and
// overlong forms included (msgspec raises UnicodeDecodeError there).
func checkUTF8(s []byte, path string) error {
	if ascii(s) || utf8.Valid(s) {
		return nil
	}
	pos := 0
	for pos < len(s) {
		r, size := utf8.DecodeRune(s[pos:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		pos += size
	}
	return invalid("invalid UTF-8: byte 0x%02x at position %d%s", s[pos], pos, at(path))
}

// ascii reports whether s is all ASCII, 32 bytes a step: the hashes and
// ids the protocol carries are, and this is several times faster than
// utf8.Valid on them.
func ascii(s []byte) bool {
	var or uint64
	for len(s) >= 32 {
		or |= binary.LittleEndian.Uint64(s) | binary.LittleEndian.Uint64(s[8:]) |
			binary.LittleEndian.Uint64(s[16:]) | binary.LittleEndian.Uint64(s[24:])
		s = s[32:]
	}
	for len(s) >= 8 {
		or |= binary.LittleEndian.Uint64(s)
		s = s[8:]
	}
	for _, c := range s {
		or |= uint64(c)
	}
	return or&0x8080808080808080 == 0
}

// skip consumes one value of any type without recursion, following nesting
// up to maxDepth.
func (r *reader) skip() error {
	var stackBuf [16]uint64
	stack := stackBuf[:0] // items left in each enclosing container
	left := uint64(1)     // items left at the current level
	for {
		for left == 0 {
			if len(stack) == 0 {
				return nil
			}
			left, stack = stack[len(stack)-1], stack[:len(stack)-1]
		}
		left--
		c, err := r.peek()
		if err != nil {
			return err
		}
		switch {
		case isArray(c) || isMap(c):
			n, err := r.containerLen(c)
			if err != nil {
				return err
			}
			if len(stack)+1 >= maxDepth {
				return &decodeError{ErrMalformed, "maximum nesting depth " + strconv.Itoa(maxDepth) + " exceeded"}
			}
			if isMap(c) {
				n *= 2
			}
			if n > 0 {
				stack = append(stack, left)
				left = n
			}
		case isStr(c):
			if _, err := r.strBody(c); err != nil {
				return err
			}
		case isBin(c):
			if _, err := r.binBody(c); err != nil {
				return err
			}
		case isInt(c):
			if _, err := r.intBody(c); err != nil {
				return err
			}
		default:
			if err := r.skipScalar(c); err != nil {
				return err
			}
		}
	}
}

// skipScalar consumes nil, bool, float or ext.
func (r *reader) skipScalar(c byte) error {
	r.i++
	var n uint64
	switch c {
	case 0xc0, 0xc2, 0xc3:
		return nil
	case 0xca:
		n = 4
	case 0xcb:
		n = 8
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext: type byte + 1..16
		n = 1 + 1<<(c-0xd4)
	case 0xc7, 0xc8, 0xc9: // ext 8/16/32: length, type byte, data
		l, err := r.length(1 << (c - 0xc7))
		if err != nil {
			return err
		}
		n = l + 1
	}
	_, err := r.take(n)
	return err
}

// end checks that nothing follows the top-level value.
func (r *reader) end() error {
	if r.i != len(r.b) {
		return malformed("trailing characters (byte %d)", r.i)
	}
	return nil
}
