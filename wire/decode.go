package wire

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// structHeader reads the top-level map header of a message.
func (r *reader) structHeader() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if !isMap(c) {
		return 0, invalid("Expected `object`, got `%s`", typeName(c, false))
	}
	return r.containerLen(c)
}

// key reads a map key of a message, which must be a str. Its bytes are not
// checked for UTF-8: a corrupted name is just an unknown key.
func (r *reader) key() ([]byte, error) {
	// Keys are short: a fixstr whole in the buffer is read here, anything
	// else below, where every error is made.
	if i := r.i; i < len(r.b) {
		if c := r.b[i]; c&0xe0 == 0xa0 {
			lo, hi := i+1, i+1+int(c&0x1f)
			if hi <= len(r.b) {
				r.i = hi
				return r.b[lo:hi:hi], nil
			}
		}
	}
	return r.keySlow()
}

func (r *reader) keySlow() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	if !isStr(c) {
		return nil, invalid("Expected `str`, got `%s` - at `key` in `$`", typeName(c, true))
	}
	s, err := r.strBody(c)
	if err != nil {
		return nil, err
	}
	return r.b[s.lo:s.hi], nil
}

// tag checks one occurrence of the "type" key's value.
func (r *reader) tag(want string) error {
	if i, n := r.i, len(want); i+1+n <= len(r.b) && r.b[i] == 0xa0|byte(n) && string(r.b[i+1:i+1+n]) == want {
		r.i = i + 1 + n
		return nil
	}
	return r.tagSlow(want)
}

func (r *reader) tagSlow(want string) error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	if !isStr(c) {
		return invalid("Expected `str`, got `%s` - at `$.type`", typeName(c, true))
	}
	s, err := r.strBody(c)
	if err != nil {
		return err
	}
	v := r.b[s.lo:s.hi]
	if err := checkUTF8(v, "$.type"); err != nil {
		return err
	}
	if string(v) != want {
		return invalid("Invalid value '%s' - at `$.type`", v)
	}
	return nil
}

func missing(field string) error {
	return invalid("Object missing required field `%s`", field)
}

// strs returns parts as strings: old[i] where it holds the same bytes
// (strings cannot change, so keeping one shares nothing that can), the
// others copied, into one allocation when several changed.
func strs[T [2]string | [3]string](old T, parts ...[]byte) (out T) {
	var same [3]bool
	total, changed, last := 0, 0, 0
	for i, p := range parts {
		if same[i] = old[i] == string(p); same[i] {
			out[i] = old[i]
		} else {
			total, changed, last = total+len(p), changed+1, i
		}
	}
	switch changed {
	case 0:
		return out
	case 1:
		out[last] = string(parts[last])
		return out
	}
	var sb strings.Builder
	sb.Grow(total)
	for i, p := range parts {
		if !same[i] {
			sb.Write(p)
		}
	}
	all := sb.String()
	off := 0
	for i, p := range parts {
		if !same[i] {
			out[i] = all[off : off+len(p)]
			off += len(p)
		}
	}
	return out
}

// reqView is a decoded XferReq whose strings alias the input buffer: valid
// only while that buffer is, and checked as DecodeReq checks them (UTF-8
// included). It lets a producer handle a request without allocating.
type reqView struct {
	MMHash, CompatibilityHash, SessionID []byte
	// Version is the connector version; HasVersion says it was on the
	// wire (absent means the receiver's own default).
	Version      Int
	HasVersion   bool
	Agent        []byte // the ecx_agent extension, or empty
	Attempt      uint64 // the ecx_attempt extension, or zero
	AcceptsShape bool   // the ecx_shape_ok extension
	Contact      bool   // the ecx_contact extension
	Known        uint64 // the ecx_known extension, or zero
}

// effectiveVersion returns the version, ConnectorVersion when absent.
func (r *reqView) effectiveVersion() Int {
	if !r.HasVersion {
		return IntOf(ConnectorVersion)
	}
	return r.Version
}

// decodeReqView decodes like DecodeReq without copying: see reqView.
func decodeReqView(data []byte, r *reqView) error {
	d := reader{b: data}
	n, err := d.structHeader()
	if err != nil {
		return err
	}
	var mm, compat, sess, agent span
	var haveMM, haveCompat, haveVersion bool
	var attempt uint64
	var version Int
	var shapeOK, contact bool
	var known uint64
	for ; n > 0; n-- {
		k, err := d.key()
		if err != nil {
			return err
		}
		switch string(k) {
		case "type":
			err = d.tag("req")
		case "mm_hash":
			mm, err = d.readStr("$.mm_hash")
			haveMM = true
		case "compatibility_hash":
			compat, err = d.readStr("$.compatibility_hash")
			haveCompat = true
		case "session_id":
			sess, err = d.readStr("$.session_id")
		case "connector_version":
			version, err = d.readInt(pathVersion)
			haveVersion = true
		case "ecx_agent":
			agent, err = d.extStr()
		case "ecx_attempt":
			attempt, err = d.extUint()
		case "ecx_shape_ok":
			shapeOK, err = d.extBool()
		case "ecx_contact":
			contact, err = d.extBool()
		case "ecx_known":
			known, err = d.extUint()
		default:
			err = d.skip()
		}
		if err != nil {
			return err
		}
	}
	if !haveMM {
		return missing("mm_hash")
	}
	if !haveCompat {
		return missing("compatibility_hash")
	}
	if err := d.end(); err != nil {
		return err
	}
	*r = reqView{MMHash: data[mm.lo:mm.hi:mm.hi], CompatibilityHash: data[compat.lo:compat.hi:compat.hi],
		SessionID: data[sess.lo:sess.hi:sess.hi], Version: version, HasVersion: haveVersion,
		Agent: data[agent.lo:agent.hi:agent.hi], Attempt: attempt, AcceptsShape: shapeOK, Contact: contact, Known: known}
	return nil
}

// DecodeReq decodes an XferReq as msgspec does; on error r is unchanged.
func DecodeReq(data []byte, r *XferReq) error {
	var v reqView
	if err := decodeReqView(data, &v); err != nil {
		return err
	}
	s := strs([3]string{r.MMHash, r.CompatibilityHash, r.SessionID}, v.MMHash, v.CompatibilityHash, v.SessionID)
	agent := r.Agent
	if agent != string(v.Agent) {
		agent = string(v.Agent)
	}
	*r = XferReq{MMHash: s[0], CompatibilityHash: s[1], SessionID: s[2], Agent: agent, Attempt: v.Attempt,
		AcceptsShape: v.AcceptsShape, Contact: v.Contact, Known: v.Known}
	if v.HasVersion && v.Version != IntOf(ConnectorVersion) {
		ver := v.Version
		r.ConnectorVersion = &ver
	}
	return nil
}

func pathVersion() string { return "$.connector_version" }

// ackView is a decoded XferAck whose strings and bytes alias the input
// buffer: valid only while that buffer is, and checked as DecodeAck checks
// them. It lets a consumer handle an ack without allocating.
type ackView struct {
	MMHash, SessionID            []byte
	Status                       Status
	AgentMetadata, MemDescriptor []byte
	blocks                       []byte // src_block_indices as encoded, checked
	nBlocks                      int
	Grant, LeaseMillis, Attempt  uint64 // the extensions, zero when absent
	Token                        Token  // ecx_token; zero when absent
	Shape                        Blocks // ecx_shape; Count zero when absent
	Touch                        Blocks // ecx_touch; Count zero when absent
}

// numBlocks returns the number of source block indices.
func (a *ackView) numBlocks() int { return a.nBlocks }

// appendBlocks appends the source block indices to dst.
func (a *ackView) appendBlocks(dst []Int) []Int {
	if a.nBlocks == 0 {
		return dst
	}
	n := len(dst)
	dst = slices.Grow(dst, a.nBlocks)[:n+a.nBlocks] // no temporary, even under -race
	d := reader{b: a.blocks}
	d.intArray(dst[n:]) // checked when decoded: cannot fail
	return dst
}

// appendBlockIDs appends the source block ids to dst as ints, in one pass,
// if every one is in [0, limit); otherwise it returns dst unchanged and
// false, and appendBlocks tells what the ids are.
func (a *ackView) appendBlockIDs(dst []int, limit int) ([]int, bool) {
	if a.nBlocks == 0 {
		return dst, true
	}
	n := len(dst)
	grown := slices.Grow(dst, a.nBlocks)[:n+a.nBlocks]
	out := grown[n:]
	d := reader{b: a.blocks}
	if _, err := d.blocksHeader(); err != nil {
		return dst, false // checked when decoded: cannot happen
	}
	i, lim := d.i, uint64(max(limit, 0))
	for k := range out {
		// The view was checked: every id is a whole int.
		v, next, ok := fastUint(d.b, i)
		if !ok { // a form fastUint does not read
			d.i = i
			x, _, err := d.int()
			if v, ok = x.Uint64(); err != nil || !ok {
				return dst, false
			}
			next = d.i
		}
		if v >= lim {
			return dst, false
		}
		out[k], i = int(v), next
	}
	return grown, true
}

// decodeAckView decodes like DecodeAck without copying: see ackView.
func decodeAckView(data []byte, a *ackView) error {
	d := reader{b: data}
	n, err := d.structHeader()
	if err != nil {
		return err
	}
	var mm, sess, meta, desc, blocks span
	var haveMM, haveStatus bool
	var status Int
	var grant, lease, attempt uint64
	var token Token
	var shape, touch Blocks
	nBlocks := 0
	for ; n > 0; n-- {
		k, err := d.key()
		if err != nil {
			return err
		}
		switch string(k) {
		case "type":
			err = d.tag("ack")
		case "mm_hash":
			mm, err = d.readStr("$.mm_hash")
			haveMM = true
		case "status":
			status, err = d.readInt(pathStatus)
			if err == nil {
				if u, ok := status.Uint64(); !ok || u > uint64(maxStatus) {
					err = invalid("Invalid enum value %s - at `$.status`", status)
				}
			}
			haveStatus = true
		case "session_id":
			sess, err = d.readStr("$.session_id")
		case "src_block_indices":
			blocks.lo = d.i
			nBlocks, err = d.intArray(nil)
			blocks.hi = d.i
		case "agent_metadata":
			meta, err = d.readBin("$.agent_metadata")
		case "mem_descriptor":
			desc, err = d.readBin("$.mem_descriptor")
		case "ecx_grant":
			grant, err = d.extUint()
		case "ecx_token":
			token, err = d.extToken()
		case "ecx_lease_ms":
			lease, err = d.extUint()
		case "ecx_attempt":
			attempt, err = d.extUint()
		case "ecx_shape":
			shape, err = d.extShape()
		case "ecx_touch":
			touch, err = d.extShape()
		default:
			err = d.skip()
		}
		if err != nil {
			return err
		}
	}
	if !haveMM {
		return missing("mm_hash")
	}
	if !haveStatus {
		return missing("status")
	}
	if err := d.end(); err != nil {
		return err
	}
	*a = ackView{MMHash: data[mm.lo:mm.hi:mm.hi], SessionID: data[sess.lo:sess.hi:sess.hi], Status: Status(status.u),
		AgentMetadata: data[meta.lo:meta.hi:meta.hi], MemDescriptor: data[desc.lo:desc.hi:desc.hi],
		blocks: data[blocks.lo:blocks.hi:blocks.hi], nBlocks: nBlocks, Grant: grant, Token: token, LeaseMillis: lease, Attempt: attempt, Shape: shape, Touch: touch}
	return nil
}

// DecodeAck decodes an XferAck as msgspec's Decoder(XferAck) does.
func DecodeAck(data []byte, a *XferAck) error {
	var v ackView
	if err := decodeAckView(data, &v); err != nil {
		return err
	}
	s := strs([2]string{a.MMHash, a.SessionID}, v.MMHash, v.SessionID)
	*a = XferAck{MMHash: s[0], Status: v.Status, SessionID: s[1], Grant: v.Grant, Token: v.Token, LeaseMillis: v.LeaseMillis, Attempt: v.Attempt, Shape: v.Shape, Touch: v.Touch}
	if v.nBlocks > 0 {
		a.SrcBlockIndices = v.appendBlocks(make([]Int, 0, v.nBlocks))
	}
	if lm, ld := len(v.AgentMetadata), len(v.MemDescriptor); lm+ld > 0 {
		buf := make([]byte, lm+ld)
		copyBlob(buf, v.AgentMetadata)
		copyBlob(buf[lm:], v.MemDescriptor)
		if lm > 0 {
			a.AgentMetadata = buf[:lm:lm]
		}
		if ld > 0 {
			a.MemDescriptor = buf[lm:]
		}
	}
	return nil
}

// decodeAckInto is DecodeAck for a value that is decoded into again and
// again: it reuses the capacity of a's slices (SrcBlockIndices,
// AgentMetadata, MemDescriptor) instead of allocating, so the slices a held
// before are overwritten; they must not be kept elsewhere, overlap, or
// alias data. A field absent from data is nil, as with DecodeAck. On error
// a is left unchanged.
func decodeAckInto(data []byte, a *XferAck) error {
	var v ackView
	if err := decodeAckView(data, &v); err != nil {
		return err
	}
	s := strs([2]string{a.MMHash, a.SessionID}, v.MMHash, v.SessionID)
	blocks, meta, desc := a.SrcBlockIndices[:0], a.AgentMetadata[:0], a.MemDescriptor[:0]
	*a = XferAck{MMHash: s[0], Status: v.Status, SessionID: s[1], Grant: v.Grant, Token: v.Token, LeaseMillis: v.LeaseMillis, Attempt: v.Attempt, Shape: v.Shape, Touch: v.Touch}
	if v.nBlocks > 0 {
		a.SrcBlockIndices = v.appendBlocks(blocks)
	}
	if len(v.AgentMetadata) > 0 {
		a.AgentMetadata = appendBlob(meta, v.AgentMetadata)
	}
	if len(v.MemDescriptor) > 0 {
		a.MemDescriptor = appendBlob(desc, v.MemDescriptor)
	}
	return nil
}

func pathStatus() string { return "$.status" }

// intArray reads src_block_indices: an array of integers. With out nil it
// only checks them; otherwise it stores them into out, which must be long
// enough. Block ids take one to three bytes: those it reads inline, and
// hands anything else (wider, signed, truncated, not an int) to int, so
// that every error is the one int gives.
func (r *reader) intArray(out []Int) (int, error) {
	n, err := r.blocksHeader()
	if err != nil {
		return 0, err
	}
	if out == nil {
		return r.skipInts(n)
	}
	b, i := r.b, r.i
	for k := uint64(0); k < n; k++ {
		var v Int
		switch {
		case i >= len(b):
			return 0, errTruncated
		case b[i] <= 0x7f:
			v.u = uint64(b[i])
			i++
		case b[i] == 0xcc && i+1 < len(b):
			v.u = uint64(b[i+1])
			i += 2
		case b[i] == 0xcd && i+2 < len(b):
			v.u = uint64(b[i+1])<<8 | uint64(b[i+2])
			i += 3
		default:
			r.i = i
			var c byte
			v, c, err = r.int()
			if err == errNotInt {
				return 0, expected("int", c, "$.src_block_indices["+itoa(k)+"]")
			}
			if err != nil {
				return 0, err
			}
			i = r.i
		}
		if out != nil {
			out[k] = v
		}
	}
	r.i = i
	return int(n), nil
}

// skipInts is intArray's check: the same forms read inline, the same
// handed to int, no value kept.
func (r *reader) skipInts(n uint64) (int, error) {
	b, i := r.b, r.i
	for k := uint64(0); k < n; k++ {
		switch {
		case i >= len(b):
			return 0, errTruncated
		case b[i] <= 0x7f:
			i++
		case b[i] == 0xcc && i+1 < len(b):
			i += 2
		case b[i] == 0xcd && i+2 < len(b):
			i += 3
		default:
			r.i = i
			_, c, err := r.int()
			if err == errNotInt {
				return 0, expected("int", c, "$.src_block_indices["+itoa(k)+"]")
			}
			if err != nil {
				return 0, err
			}
			i = r.i
		}
	}
	r.i = i
	return int(n), nil
}

// blocksHeader reads the array header of src_block_indices.
func (r *reader) blocksHeader() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if !isArray(c) {
		return 0, expected("array", c, "$.src_block_indices")
	}
	return r.containerLen(c)
}

func itoa(i uint64) string { return UintOf(i).String() }

// DecodeMemDescs decodes a mem descriptor: [addr, size, device_id] triples.
func DecodeMemDescs(data []byte) ([]MemDesc, error) {
	var descs []MemDesc
	err := walkMemDescs(data, func(n uint64) {
		// A triple takes 4 bytes at least: never trust the declared count.
		descs = make([]MemDesc, 0, min(n, uint64(len(data))/4))
	}, func(_ uint64, d MemDesc) bool {
		descs = append(descs, d)
		return true
	})
	if err != nil {
		return nil, err
	}
	return descs, nil
}

// Blocks is a region: Count blocks of Size bytes from Base, on Device.
type Blocks struct {
	Base, Size uint64
	Count      int
	Device     uint64
}

// DecodeBlocks decodes a mem descriptor as Blocks; ok is false for a
// well-formed one that is not Blocks (use [DecodeMemDescs]).
func DecodeBlocks(data []byte) (b Blocks, ok bool, err error) {
	if b, ok := decodeBlocksFast(data); ok {
		return b, true, nil
	}
	ok = true
	err = walkMemDescs(data, nil, func(i uint64, d MemDesc) bool {
		addr, ok1 := d.Addr.Uint64()
		size, ok2 := d.Size.Uint64()
		dev, ok3 := d.Device.Uint64()
		switch {
		case !ok1 || !ok2 || !ok3 || size == 0:
			ok = false
		case i == 0:
			b = Blocks{Base: addr, Size: size, Device: dev}
		case size != b.Size || dev != b.Device || i > (math.MaxUint64-b.Base)/b.Size || addr != b.Base+i*b.Size:
			ok = false
		}
		b.Count++
		return ok
	})
	if err != nil || !ok || b.Count == 0 || uint64(b.Count) > (math.MaxUint64-b.Base)/b.Size { // the last block ends in range
		return Blocks{}, false, err
	}
	return b, true, nil
}

// walkMemDescs checks a mem descriptor and hands each triple to f, in
// order, until f returns false (the rest is still checked); count, if
// not nil, gets the declared length first.
func walkMemDescs(data []byte, count func(n uint64), f func(i uint64, d MemDesc) bool) error {
	d := reader{b: data}
	c, err := d.peek()
	if err != nil {
		return err
	}
	if !isArray(c) {
		return expected("array", c, "")
	}
	n, err := d.containerLen(c)
	if err != nil {
		return err
	}
	if count != nil {
		count(n)
	}
	more := true
	for i := uint64(0); i < n; i++ {
		c, err := d.peek()
		if err != nil {
			return err
		}
		if !isArray(c) {
			return expected("array", c, "$["+itoa(i)+"]")
		}
		m, err := d.containerLen(c)
		if err != nil {
			return err
		}
		if m != 3 {
			return invalid("Expected `array` of length 3, got %d - at `$[%d]`", m, i)
		}
		var t [3]Int
		for j := range t {
			var c byte
			t[j], c, err = d.int()
			if err == errNotInt {
				return expected("int", c, "$["+itoa(i)+"]["+itoa(uint64(j))+"]")
			}
			if err != nil {
				return err
			}
		}
		if more {
			more = f(i, MemDesc{t[0], t[1], t[2]})
		}
	}
	return d.end()
}

// fastUint reads an unsigned int that fits an int64 at b[i:]; ok is false
// for anything else.
func fastUint(b []byte, i int) (v uint64, next int, ok bool) {
	if i >= len(b) {
		return 0, i, false
	}
	switch c := b[i]; {
	case c <= 0x7f:
		return uint64(c), i + 1, true
	case c == 0xcc && i+1 < len(b):
		return uint64(b[i+1]), i + 2, true
	case c == 0xcd && i+2 < len(b):
		return uint64(binary.BigEndian.Uint16(b[i+1:])), i + 3, true
	case c == 0xce && i+4 < len(b):
		return uint64(binary.BigEndian.Uint32(b[i+1:])), i + 5, true
	case c == 0xcf && i+8 < len(b) && b[i+1] < 0x80:
		return binary.BigEndian.Uint64(b[i+1:]), i + 9, true
	}
	return 0, i, false
}

// decodeBlocksFast is DecodeBlocks for a descriptor of back-to-back blocks
// written as msgpack writes unsigned ints: one pass over the bytes, no
// call per block. ok is false for anything else, which DecodeBlocks then
// reads the general way (errors included).
func decodeBlocksFast(data []byte) (bl Blocks, ok bool) {
	d := reader{b: data}
	c, err := d.peek()
	if err != nil || !isArray(c) {
		return bl, false
	}
	n, err := d.containerLen(c)
	if err != nil || n == 0 || n > uint64(len(data)) {
		return bl, false
	}
	// fastUint's values are under 2^63, so no address plus a size wraps,
	// and the last block ends in range.
	b, i := data, d.i
	var next uint64
	for k := uint64(0); k < n; k++ {
		if i >= len(b) || b[i] != 0x93 {
			return bl, false
		}
		addr, j, ok1 := fastUint(b, i+1)
		size, j, ok2 := fastUint(b, j)
		dev, j, ok3 := fastUint(b, j)
		if !ok1 || !ok2 || !ok3 {
			return bl, false
		}
		if k == 0 {
			if size == 0 {
				return bl, false
			}
			bl = Blocks{Base: addr, Size: size, Device: dev}
		} else if size != bl.Size || dev != bl.Device || addr != next {
			return bl, false
		}
		next = addr + size
		i = j
	}
	if i != len(b) { // trailing bytes: the general path reports them
		return Blocks{}, false
	}
	bl.Count = int(n)
	return bl, true
}

// peekIDs reads only the mm_hash, session_id and ecx_attempt (zero when
// absent) of a message that did not decode (a status we do not know, a
// field of the wrong type), so that its sender can still be answered or
// its transfer ended. It requires a map
// whose keys are strings and whose values are well-formed msgpack; the two
// fields must be strings, and a "type" tag, if present, must be tag ("req"
// or "ack"): a message of the other kind is not answered. The slices alias
// data.
func peekIDs(data []byte, tag string) (mmHash, sessionID []byte, attempt uint64, ok bool) {
	d := reader{b: data}
	n, err := d.structHeader()
	if err != nil {
		return nil, nil, 0, false
	}
	var mm, sess span
	haveMM := false
	for ; n > 0; n-- {
		k, err := d.key()
		if err != nil {
			return nil, nil, 0, false
		}
		switch string(k) {
		case "mm_hash":
			mm, err = d.readStr("$.mm_hash")
			haveMM = err == nil
		case "session_id":
			sess, err = d.readStr("$.session_id")
		case "ecx_attempt":
			attempt, err = d.extUint()
		case "type":
			err = d.tag(tag)
		default:
			err = d.skip()
		}
		if err != nil {
			return nil, nil, 0, false
		}
	}
	if !haveMM || mm.hi == mm.lo {
		return nil, nil, 0, false
	}
	return data[mm.lo:mm.hi:mm.hi], data[sess.lo:sess.hi:sess.hi], attempt, true
}

// extUint reads an extension field that should be a non-negative integer.
// Like msgspec for a field it does not know, a value of another type is
// skipped and read as absent, not refused: extensions never make a message
// that vLLM's peers accept undecodable here. Malformed msgpack still is.
func (r *reader) extUint() (uint64, error) {
	v, _, err := r.int()
	if err == errNotInt {
		return 0, r.skip()
	}
	if u, ok := v.Uint64(); ok && err == nil {
		return u, nil
	}
	return 0, err
}

// extBool reads an extension field that should be a bool (see extUint).
func (r *reader) extBool() (bool, error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	if c != 0xc2 && c != 0xc3 {
		return false, r.skip()
	}
	r.i++
	return c == 0xc3, nil
}

// extToken reads ecx_token, a bin of exactly 16 bytes (see extUint).
func (r *reader) extToken() (Token, error) {
	var t Token
	c, err := r.peek()
	if err != nil {
		return t, err
	}
	if c != 0xc4 && c != 0xc5 && c != 0xc6 {
		return t, r.skip()
	}
	s, err := r.binBody(c)
	if err == nil && s.hi-s.lo == len(t) {
		copy(t[:], r.b[s.lo:s.hi])
	}
	return t, err
}

// extShape reads ecx_shape or ecx_touch, [base, size, count, device] (see extUint). A
// value that is not one reads as absent: four non-negative integers, size
// and count at least one, count within int32 (NIXL's block ids), and the
// blocks inside the address space.
func (r *reader) extShape() (Blocks, error) {
	start := r.i
	if b, ok := r.shape(); ok {
		return b, nil
	}
	r.i = start
	return Blocks{}, r.skip()
}

func (r *reader) shape() (Blocks, bool) {
	c, err := r.peek()
	if err != nil || !isArray(c) {
		return Blocks{}, false
	}
	if n, err := r.containerLen(c); err != nil || n != 4 {
		return Blocks{}, false
	}
	var v [4]uint64
	for i := range v {
		x, _, err := r.int()
		u, ok := x.Uint64()
		if err != nil || !ok {
			return Blocks{}, false
		}
		v[i] = u
	}
	base, size, count := v[0], v[1], v[2]
	if size == 0 || count == 0 || count > math.MaxInt32 || size > (math.MaxUint64-base)/count {
		return Blocks{}, false
	}
	return Blocks{Base: base, Size: size, Count: int(count), Device: v[3]}, true
}

// extStr reads an extension field that should be a UTF-8 string (see
// extUint).
func (r *reader) extStr() (span, error) {
	c, err := r.peek()
	if err != nil {
		return span{}, err
	}
	if !isStr(c) {
		return span{}, r.skip()
	}
	s, err := r.strBody(c)
	if err != nil || !utf8.Valid(r.b[s.lo:s.hi]) {
		return span{}, err
	}
	return s, nil
}
