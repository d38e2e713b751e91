// Package wire holds the EC transfer protocol's messages and their codec,
// byte-compatible with vLLM's Python peers, plus mem descriptors and the
// compatibility hash. It is pure: no I/O, no state, no goroutines.
//
// # Messages
//
// [XferReq] (consumer to producer) and [XferAck] (producer to consumer) are
// msgspec tagged structs with omit_defaults, encoded as msgpack maps. The
// golden vectors in testdata/wire, produced by the real msgspec, decide every
// byte: [AppendReq] and [AppendAck] reproduce all of them, and [DecodeReq]
// and [DecodeAck] accept exactly what msgspec accepts (missing or misplaced
// tag, unknown keys of any type, repeated keys with the last one winning,
// non-minimal forms) and refuse the rest with msgspec's own error text.
//
// # Why the codec is written by hand
//
// vmihailenco/msgpack/v5 was considered. It cannot be made to write the
// msgspec bytes without a custom encoder per type (tag first, defaults
// omitted, unsigned forms for every non-negative integer), and its decoder is
// neither strict where msgspec is (map keys must be str, int fields refuse
// floats, the status enum is range-checked, invalid UTF-8 is refused in known
// fields only) nor bounded the way a peer-facing decoder must be. The
// hand-written codec encodes into a caller's buffer without allocating,
// decodes in one pass with a bounded, non-recursive skip of unknown values,
// and never allocates in proportion to a length the input merely declares.
//
// # Decoding and allocation
//
// A decoded message owns its memory: its strings share one allocation, its
// byte fields another, its block indices a third, and none aliases the
// input. The sessions' hot paths decode the same way into views whose
// fields alias the input, without allocating.
// Errors wrap [ErrMalformed] (what msgspec calls DecodeError) or
// [ErrInvalid] (ValidationError), with msgspec's own text. Two inputs make
// msgspec raise exceptions vLLM does not catch, and are refused here: invalid UTF-8 in
// a known string field or the tag ([ErrInvalid]) and containers nested deeper
// than 500 levels inside an unknown field ([ErrMalformed]; msgspec hits
// Python's recursion limit somewhere between about 500 and 1000 levels,
// depending on the caller's stack).
//
// # Integers
//
// msgspec reads a Python int field from any msgpack integer in
// [-2^63, 2^64-1], so block indices, the connector version and mem descriptor
// values decode into [Int], which holds that whole range exactly. Range checks
// (a block index must lie in the producer's region) belong to the session
// layer.
//
// # Differences from the reference
//
//   - The connector version follows the vectors: a value equal to
//     [ConnectorVersion] is left off the wire, as msgspec does. Unlike the
//     reference, [XferReq.ConnectorVersion] tells an absent field (nil) from
//     an explicit one, so a producer can see a peer that did not say which
//     version it speaks.
//   - Go peers add fields msgspec skips (it ignores unknown fields), so
//     vLLM's peers are unaffected: [XferReq.VersionOnWire] puts
//     connector_version on the wire even at its default, ecx_agent and
//     ecx_attempt name the consumer's agent and request, ecx_shape_ok
//     offers to take a region's shape for its descriptor, ecx_known says
//     which producer metadata the consumer has registered (a digest of
//     it: no descriptor needed), and ecx_contact asks for the
//     producer's data-plane contact alone, ahead of any fetch (vLLM's
//     producer answers it NACK_MISSING: its mm_hash names no entry);
//     an ack may carry
//     ecx_grant, ecx_token (the grant's capability), ecx_lease_ms, the echoed ecx_attempt and ecx_shape (then
//     without mem_descriptor, which the offer allowed); a contact answer
//     may carry ecx_touch, a few bytes of the producer's data-plane memory
//     apart from its region, for the consumer's first READ. Zero values stay
//     off the wire, so the msgspec-exact encoding (the golden vectors) is
//     unchanged; an extension of the wrong type reads as absent.
//   - [CompatHash] reproduces Python's json.dumps escaping (ensure_ascii,
//     surrogate pairs, short escapes) instead of trusting encoding/json, which
//     differs on non-ASCII text, on <, > and &, and on DEL.
package wire
