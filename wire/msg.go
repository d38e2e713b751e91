package wire

// XferReq asks a producer for one entry (tag "req"), consumer to producer.
type XferReq struct {
	MMHash            string
	CompatibilityHash string
	SessionID         string // "" is the default and is not put on the wire
	// ConnectorVersion is nil when absent: see [XferReq.Version].
	ConnectorVersion *Int

	// Extensions that only Go peers read (msgspec skips unknown fields, so
	// vLLM's producers are unaffected). They follow the reference's fields.

	// VersionOnWire sends connector_version even at its default.
	VersionOnWire bool
	// Agent (ecx_agent) is the consumer's data-plane agent name.
	Agent string
	// Attempt (ecx_attempt) names this request; a Go producer echoes it.
	Attempt uint64
	// AcceptsShape (ecx_shape_ok) takes [XferAck.Shape].
	AcceptsShape bool
	// Contact (ecx_contact) asks for the data-plane contact alone.
	Contact bool
	// Known (ecx_known) digests the producer metadata registered.
	Known uint64
}

// Version returns the effective connector version: [ConnectorVersion] when
// the field is absent.
func (r *XferReq) Version() Int {
	if r.ConnectorVersion == nil {
		return IntOf(ConnectorVersion)
	}
	return *r.ConnectorVersion
}

// XferAck answers an [XferReq] (tag "ack"), producer to consumer. A NACK
// carries only MMHash and Status.
type XferAck struct {
	MMHash          string
	Status          Status
	SessionID       string // echo of the request's session id
	SrcBlockIndices []Int  // the entry's blocks in the producer's region
	AgentMetadata   []byte // opaque data-plane agent blob
	MemDescriptor   []byte // encoded []MemDesc of the producer's region, or empty

	// Extensions that only Go peers read (see [XferReq]); zero is left off.

	// Grant (ecx_grant) names this grant in the consumer's notification.
	Grant uint64
	// Token (ecx_token) is the grant's secret.
	Token Token
	// LeaseMillis (ecx_lease_ms) is the producer's pin lease.
	LeaseMillis uint64
	// Attempt (ecx_attempt) echoes the request's.
	Attempt uint64
	// Shape (ecx_shape) stands in for MemDescriptor.
	Shape Blocks
	// Touch (ecx_touch): memory to READ at contact.
	Touch Blocks
}

// Token is a grant's capability (ecx_token): 128 random bits.
type Token [16]byte

// IsZero reports whether t is absent.
func (t Token) IsZero() bool { return t == Token{} }

// MemDesc is one [addr, size, device_id] triple of a mem descriptor.
type MemDesc struct {
	Addr, Size, Device Int
}
