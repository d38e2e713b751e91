// Package wire holds the EC transfer protocol's messages and their codec,
// byte-compatible with vLLM's Python peers, plus mem descriptors and the
// compatibility hash. It is pure: no I/O, no state, no goroutines. The
// sessions use it; an engine needs it for [CompatHash], and to read a
// NACK's [Status].
//
// [XferReq] (consumer to producer) and [XferAck] (producer to consumer)
// are encoded as msgspec encodes them, byte for byte (the golden vectors in
// testdata/wire are msgspec's own), and decoded as strictly as msgspec
// decodes them. Go peers add fields (ecx_*) that vLLM's peers skip.
//
//	buf := wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: id})
//	var ack wire.XferAck
//	if err := wire.DecodeAck(reply, &ack); err != nil {
//		return err // wraps ErrMalformed or ErrInvalid, with msgspec's text
//	}
//	if ack.Status != wire.OK {
//		return ack.Status // a NACK: Status.Retryable says whether to ask again
//	}
//
// A decoded message owns its memory: nothing in it aliases the input.
// Integers decode into [Int], which holds every value msgspec accepts.
//
// The design, and why (the hand-written codec, the extension fields, where
// it differs from vLLM's reference): docs/design.md in the repository.
package wire
