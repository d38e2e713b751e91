// Package wireview decodes the protocol's messages without allocating,
// for the sessions' hot paths: a view's strings and bytes alias the input
// buffer, valid only while that buffer is, and are checked as
// wire.DecodeReq and wire.DecodeAck check them (UTF-8 included). Package
// wire, whose codec does the work, sets the functions in its init.
//
// The fields of wire's types the views hold are plain types here, which
// wire's assign to without conversion (Token, Shape) or convert to
// (wire.Status(a.Status)).
package wireview

// Req is a decoded wire.XferReq.
type Req struct {
	MMHash, CompatibilityHash, SessionID []byte
	// Version is the connector version, negative when VersionNeg;
	// HasVersion says it was on the wire (absent means the receiver's own
	// default).
	Version      uint64
	VersionNeg   bool
	HasVersion   bool
	Agent        []byte // the ecx_agent extension, or empty
	Attempt      uint64 // the ecx_attempt extension, or zero
	AcceptsShape bool   // the ecx_shape_ok extension
	Contact      bool   // the ecx_contact extension
	Known        uint64 // the ecx_known extension, or zero
}

// VersionIs reports whether the effective connector version is v: the
// one on the wire, or the receiver's own default v when it is absent.
func (r *Req) VersionIs(v uint64) bool {
	return !r.HasVersion || !r.VersionNeg && r.Version == v
}

// Ack is a decoded wire.XferAck.
type Ack struct {
	MMHash, SessionID            []byte
	Status                       uint8 // a wire.Status
	AgentMetadata, MemDescriptor []byte
	Grant, LeaseMillis, Attempt  uint64   // the extensions, zero when absent
	Token                        [16]byte // ecx_token (a wire.Token); zero when absent
	// Shape is ecx_shape, Touch ecx_touch (wire.Blocks, which assign to
	// this unnamed type); Count zero when absent.
	Shape, Touch struct {
		Base, Size uint64
		Count      int
		Device     uint64
	}
	// Blocks is src_block_indices as encoded (checked), NumBlocks their
	// number; Raw is the whole message.
	Blocks    []byte
	NumBlocks int
	Raw       []byte
}

// Set by package wire.
var (
	// DecodeReq decodes like wire.DecodeReq without copying.
	DecodeReq func(data []byte, r *Req) error
	// DecodeAck decodes like wire.DecodeAck without copying.
	DecodeAck func(data []byte, a *Ack) error
	// AppendBlockIDs appends a's source block ids to dst as ints, in one
	// pass, if every one is in [0, limit); otherwise it returns dst
	// unchanged and false, and wire.DecodeAck of a.Raw tells what the ids
	// are.
	AppendBlockIDs func(a *Ack, dst []int, limit int) ([]int, bool)
	// PeekIDs reads only the mm_hash, session_id and ecx_attempt (zero
	// when absent) of a message that did not decode (a status we do not
	// know, a field of the wrong type), so that its sender can still be
	// answered or its transfer ended. It requires a map whose keys are
	// strings and whose values are well-formed msgpack; the two fields
	// must be strings, and a "type" tag, if present, must be tag ("req"
	// or "ack"): a message of the other kind is not answered. The slices
	// alias data.
	PeekIDs func(data []byte, tag string) (mmHash, sessionID []byte, attempt uint64, ok bool)
	// Whole checks, without decoding or allocating, that data is one
	// msgpack value and nothing after it, every length and count it
	// claims within data: what another decoder may then size its
	// allocations by.
	Whole func(data []byte) error
)
