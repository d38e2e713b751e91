package wire

// XferReq asks a producer for one entry (tag "req"), consumer to producer.
type XferReq struct {
	MMHash            string
	CompatibilityHash string
	SessionID         string // "" is the default and is not put on the wire
	ConnectorVersion  *Int   // nil when absent: see Version
	VersionOnWire     bool   // send connector_version even at its default
	Agent             string // ecx_agent: the consumer's data-plane agent
	Attempt           uint64 // ecx_attempt: names this request; Go producers echo it
	AcceptsShape      bool   // ecx_shape_ok: takes XferAck.Shape
	Contact           bool   // ecx_contact: asks for the data-plane contact alone
	Known             uint64 // ecx_known: digest of the producer metadata registered
}

// Version returns the connector version, [ConnectorVersion] when absent.
func (r *XferReq) Version() Int {
	if r.ConnectorVersion == nil {
		return IntOf(ConnectorVersion)
	}
	return *r.ConnectorVersion
}

// XferAck answers an [XferReq] (tag "ack"); a NACK has only MMHash and Status.
type XferAck struct {
	MMHash          string
	Status          Status
	SessionID       string // echo of the request's session id
	SrcBlockIndices []Int  // the entry's blocks in the producer's region
	AgentMetadata   []byte // opaque data-plane agent blob
	MemDescriptor   []byte // encoded []MemDesc of the producer's region, or empty
	Grant           uint64 // ecx_grant: names this grant in the notification
	Token           Token  // ecx_token: the grant's secret
	LeaseMillis     uint64 // ecx_lease_ms: the producer's pin lease
	Attempt         uint64 // ecx_attempt: the request's, echoed
	Shape           Blocks // ecx_shape: stands in for MemDescriptor
	Touch           Blocks // ecx_touch: memory to READ at contact
}

// Token is a grant's capability (ecx_token): 128 random bits.
type Token [16]byte

// IsZero reports whether t is absent.
func (t Token) IsZero() bool { return t == Token{} }

// MemDesc is one [addr, size, device_id] triple of a mem descriptor.
type MemDesc struct {
	Addr, Size, Device Int
}
