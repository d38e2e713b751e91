// Package wire holds the EC transfer protocol's messages and their codec,
// byte-compatible with vLLM's Python peers (msgspec over msgpack), plus mem
// descriptors and the compatibility hash. It is pure: no I/O, no state. An
// engine needs it for [CompatHash], and to read a NACK's [Status]; the
// sessions use the rest.
//
//	buf := wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: id})
//	var ack wire.XferAck
//	err := wire.DecodeAck(reply, &ack) // wraps ErrMalformed or ErrInvalid
//
// Decoding accepts exactly what msgspec accepts, and a decoded message
// aliases none of its input. Fields named ecx_* on the wire are extensions
// that only Go peers read; vLLM's peers skip them. Design notes:
// docs/design.md in the repository.
package wire
