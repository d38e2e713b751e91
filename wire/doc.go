// Package wire holds the protocol's messages and their codec, byte-compatible
// with vLLM's Python peers (msgspec over msgpack): decoding accepts exactly
// what msgspec accepts, and a decoded message aliases none of its input. An
// engine needs [CompatHash], and [Status] to read a NACK; the sessions use
// the rest.
//
//	buf := wire.AppendReq(nil, &wire.XferReq{MMHash: h, CompatibilityHash: compat, SessionID: id})
//	err := wire.DecodeAck(reply, &ack) // wraps ErrMalformed or ErrInvalid
package wire
