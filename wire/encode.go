package wire

import (
	"encoding/binary"
	"slices"
)

// Keys and tags as msgspec writes them: fixstr headers included.
const (
	keyType    = "\xa4type"
	tagReq     = "\xa3req"
	tagAck     = "\xa3ack"
	keyMMHash  = "\xa7mm_hash"
	keyCompat  = "\xb2compatibility_hash"
	keySession = "\xaasession_id"
	keyVersion = "\xb1connector_version"
	keyStatus  = "\xa6status"
	keyBlocks  = "\xb1src_block_indices"
	keyMeta    = "\xaeagent_metadata"
	keyMemDesc = "\xaemem_descriptor"
	keyAgent   = "\xa9ecx_agent"
	keyGrant   = "\xa9ecx_grant"
	keyLease   = "\xacecx_lease_ms"
	keyAttempt = "\xabecx_attempt"
	keyShapeOK = "\xacecx_shape_ok"
	keyShape   = "\xa9ecx_shape"
	keyTouch   = "\xa9ecx_touch"
	keyToken   = "\xa9ecx_token"
	keyContact = "\xabecx_contact"
	keyKnown   = "\xa9ecx_known"
)

// AppendReq appends r's encoding to dst, as msgspec writes it.
func AppendReq(dst []byte, r *XferReq) []byte {
	n := 3
	if r.SessionID != "" {
		n++
	}
	writeVersion := r.VersionOnWire || (r.ConnectorVersion != nil && *r.ConnectorVersion != IntOf(ConnectorVersion))
	if writeVersion {
		n++
	}
	if r.Agent != "" {
		n++
	}
	if r.Attempt != 0 {
		n++
	}
	if r.AcceptsShape {
		n++
	}
	if r.Contact {
		n++
	}
	if r.Known != 0 {
		n++
	}
	dst = append(dst, 0x80|byte(n))
	dst = append(dst, keyType+tagReq+keyMMHash...)
	dst = appendStr(dst, r.MMHash)
	dst = append(dst, keyCompat...)
	dst = appendStr(dst, r.CompatibilityHash)
	if r.SessionID != "" {
		dst = append(dst, keySession...)
		dst = appendStr(dst, r.SessionID)
	}
	if writeVersion {
		dst = append(dst, keyVersion...)
		dst = appendInt(dst, r.Version())
	}
	if r.Agent != "" {
		dst = append(dst, keyAgent...)
		dst = appendStr(dst, r.Agent)
	}
	if r.Attempt != 0 {
		dst = append(dst, keyAttempt...)
		dst = appendUint(dst, r.Attempt)
	}
	if r.AcceptsShape {
		dst = append(dst, keyShapeOK+"\xc3"...)
	}
	if r.Contact {
		dst = append(dst, keyContact+"\xc3"...)
	}
	if r.Known != 0 {
		dst = append(dst, keyKnown...)
		dst = appendUint(dst, r.Known)
	}
	return dst
}

// AppendAck appends a's encoding to dst, as msgspec writes it.
func AppendAck(dst []byte, a *XferAck) []byte {
	n := 3
	for _, set := range [...]bool{a.SessionID != "", len(a.SrcBlockIndices) > 0, len(a.AgentMetadata) > 0, len(a.MemDescriptor) > 0, a.Grant != 0, !a.Token.IsZero(), a.LeaseMillis != 0, a.Attempt != 0, a.Shape.Count > 0, a.Touch.Count > 0} {
		if set {
			n++
		}
	}
	dst = append(dst, 0x80|byte(n))
	dst = append(dst, keyType+tagAck+keyMMHash...)
	dst = appendStr(dst, a.MMHash)
	dst = append(dst, keyStatus...)
	dst = appendUint(dst, uint64(a.Status))
	if a.SessionID != "" {
		dst = append(dst, keySession...)
		dst = appendStr(dst, a.SessionID)
	}
	if len(a.SrcBlockIndices) > 0 {
		dst = append(dst, keyBlocks...)
		dst = appendArrayHeader(dst, len(a.SrcBlockIndices))
		dst = appendIDs(dst, a.SrcBlockIndices)
	}
	if len(a.AgentMetadata) > 0 {
		dst = append(dst, keyMeta...)
		dst = appendBin(dst, a.AgentMetadata)
	}
	if len(a.MemDescriptor) > 0 {
		dst = append(dst, keyMemDesc...)
		dst = appendBin(dst, a.MemDescriptor)
	}
	if a.Grant != 0 {
		dst = append(dst, keyGrant...)
		dst = appendUint(dst, a.Grant)
	}
	if !a.Token.IsZero() {
		dst = append(dst, keyToken+"\xc4\x10"...)
		dst = append(dst, a.Token[:]...)
	}
	if a.LeaseMillis != 0 {
		dst = append(dst, keyLease...)
		dst = appendUint(dst, a.LeaseMillis)
	}
	if a.Attempt != 0 {
		dst = append(dst, keyAttempt...)
		dst = appendUint(dst, a.Attempt)
	}
	if a.Shape.Count > 0 {
		dst = appendBlocks(append(dst, keyShape...), a.Shape)
	}
	if a.Touch.Count > 0 {
		dst = appendBlocks(append(dst, keyTouch...), a.Touch)
	}
	return dst
}

// appendBlocks appends b as [base, size, count, device].
func appendBlocks(dst []byte, b Blocks) []byte {
	dst = append(dst, 0x94)
	dst = appendUint(dst, b.Base)
	dst = appendUint(dst, b.Size)
	dst = appendUint(dst, uint64(b.Count))
	return appendUint(dst, b.Device)
}

// AppendMemDescs appends the encoding of descs to dst.
func AppendMemDescs(dst []byte, descs []MemDesc) []byte {
	dst = appendArrayHeader(dst, len(descs))
	for i := range descs {
		dst = append(dst, 0x93)
		dst = appendInt(dst, descs[i].Addr)
		dst = appendInt(dst, descs[i].Size)
		dst = appendInt(dst, descs[i].Device)
	}
	return dst
}

// AppendBlockDescs appends the descriptor of count blocks from base.
func AppendBlockDescs(dst []byte, base, blockSize uint64, count int, device int64) []byte {
	dst = appendArrayHeader(dst, count)
	dev := IntOf(device)
	for i := range count {
		dst = append(dst, 0x93)
		dst = appendUint(dst, base+uint64(i)*blockSize)
		dst = appendUint(dst, blockSize)
		dst = appendInt(dst, dev)
	}
	return dst
}

// blockDescs returns the per-block descriptor list of a region (see
// [AppendBlockDescs]).
func blockDescs(base, blockSize uint64, count int, device int64) []MemDesc {
	descs := make([]MemDesc, count)
	for i := range descs {
		descs[i] = MemDesc{Addr: UintOf(base + uint64(i)*blockSize), Size: UintOf(blockSize), Device: IntOf(device)}
	}
	return descs
}

func appendStr(dst []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n < 1<<8:
		dst = append(dst, 0xd9, byte(n))
	case n < 1<<16:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0xdb)
		dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	}
	return append(dst, s...)
}

func appendBin(dst []byte, b []byte) []byte {
	switch n := len(b); {
	case n < 1<<8:
		dst = append(dst, 0xc4, byte(n))
	case n < 1<<16:
		dst = append(dst, 0xc5, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0xc6)
		dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	}
	return append(dst, b...)
}

func appendArrayHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n < 1<<16:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0xdd)
		return binary.BigEndian.AppendUint32(dst, uint32(n))
	}
}

// appendIDs appends vs as appendInt does, block ids of up to three bytes
// without a capacity check each.
func appendIDs(dst []byte, vs []Int) []byte {
	for len(vs) > 0 {
		dst = slices.Grow(dst, 3*len(vs))
		b, i := dst[:cap(dst)], len(dst)
		k := 0
		for ; k < len(vs) && i+3 <= len(b); k++ {
			v := vs[k]
			switch {
			case v.neg || v.u >= 1<<16:
				b = appendInt(b[:i], v)
				i = len(b)
				b = b[:cap(b)]
			case v.u < 1<<7:
				b[i] = byte(v.u)
				i++
			case v.u < 1<<8:
				b[i], b[i+1] = 0xcc, byte(v.u)
				i += 2
			default:
				b[i], b[i+1], b[i+2] = 0xcd, byte(v.u>>8), byte(v.u)
				i += 3
			}
		}
		dst, vs = b[:i], vs[k:]
	}
	return dst
}

// appendInt writes v in the smallest form; non-negative values always take
// the unsigned forms, as msgspec does.
func appendInt(dst []byte, v Int) []byte {
	if !v.neg {
		return appendUint(dst, v.u)
	}
	s := int64(v.u)
	switch {
	case s >= -32:
		return append(dst, byte(s))
	case s >= -1<<7:
		return append(dst, 0xd0, byte(s))
	case s >= -1<<15:
		return append(dst, 0xd1, byte(s>>8), byte(s))
	case s >= -1<<31:
		dst = append(dst, 0xd2)
		return binary.BigEndian.AppendUint32(dst, uint32(s))
	default:
		dst = append(dst, 0xd3)
		return binary.BigEndian.AppendUint64(dst, uint64(s))
	}
}

func appendUint(dst []byte, u uint64) []byte {
	switch {
	case u < 1<<7:
		return append(dst, byte(u))
	case u < 1<<8:
		return append(dst, 0xcc, byte(u))
	case u < 1<<16:
		return append(dst, 0xcd, byte(u>>8), byte(u))
	case u < 1<<32:
		dst = append(dst, 0xce)
		return binary.BigEndian.AppendUint32(dst, uint32(u))
	default:
		dst = append(dst, 0xcf)
		return binary.BigEndian.AppendUint64(dst, u)
	}
}
