// Package wire holds the EC transfer protocol's messages and their codec,
// byte-compatible with vLLM's Python peers (msgspec over msgpack), plus mem
// descriptors and the compatibility hash. It is pure: no I/O, no state. An
// engine needs it for [CompatHash], and to read a NACK's [Status]; the
// sessions use the rest.
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
// Decoding accepts exactly what msgspec accepts. A decoded message owns its
// memory: nothing in it aliases the input. Fields named ecx_* on the wire are
// extensions only Go peers read; vLLM's peers skip them. Design notes:
// docs/design.md.
package wire
