package wire

// XferReq asks a producer for one entry (tag "req"), consumer to producer.
type XferReq struct {
	MMHash            string
	CompatibilityHash string
	SessionID         string // "" is the default and is not put on the wire
	// ConnectorVersion is the sender's version. Nil means the field is absent,
	// which msgspec reads as the receiver's own default: use [XferReq.Version]
	// for the effective value. A non-nil value equal to [ConnectorVersion] is
	// left off the wire, as msgspec does, so it decodes back as nil.
	ConnectorVersion *Int

	// Extensions that only Go peers read (msgspec skips unknown fields, so
	// vLLM's producers are unaffected). They follow the reference's fields.

	// VersionOnWire puts connector_version on the wire even when it equals
	// [ConnectorVersion], so that a producer of another version NACKs
	// instead of reading the absent field as its own default.
	VersionOnWire bool
	// Agent ("ecx_agent") is the consumer's data-plane agent name: a Go
	// producer lets only that agent read and complete the grant.
	Agent string
	// Attempt ("ecx_attempt") names this request; a Go producer echoes it
	// in the ack, so that a late or repeated ack of an earlier request for
	// the same mm_hash is not taken for this one's.
	Attempt uint64
	// AcceptsShape ("ecx_shape_ok") says the consumer takes
	// [XferAck.Shape] in place of the mem descriptor.
	AcceptsShape bool
	// Contact ("ecx_contact") asks for the producer's data-plane contact
	// only, ahead of any fetch: a Go producer answers OK with its agent
	// metadata and its mem descriptor (or shape), no blocks and no grant.
	// Its MMHash is "ecxfer-contact", not a content hash: vLLM's producer
	// reads the request as one for an entry it does not hold, and answers
	// NACK_MISSING.
	Contact bool
	// Known ("ecx_known") is a digest of the producer's agent metadata the
	// consumer has registered (the first 8 bytes of its SHA-256, never
	// zero): a Go producer whose metadata it is leaves the mem descriptor
	// and the shape out of its OK ack.
	Known uint64
}

// Version returns the effective connector version: [ConnectorVersion] when the
// field is absent.
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

	// Grant ("ecx_grant") names this grant. A Go consumer appends it to its
	// notification ("<session_id>:<mm_hash>#<grant>"), so that the producer
	// ends exactly this grant however notifications are delayed.
	Grant uint64
	// Token ("ecx_token", 16 bytes) is the grant's capability: a secret the
	// producer minted for this grant and sent only to its consumer, which
	// presents it with every READ and notification of the grant (see
	// the notification's grant suffix, "#<grant>.<token in hex>"). All zero: absent.
	Token Token
	// LeaseMillis ("ecx_lease_ms") is the producer's pin lease: a Go
	// consumer does not trust a READ it sees complete after it.
	LeaseMillis uint64
	// Attempt ("ecx_attempt") echoes the request's.
	Attempt uint64
	// Shape ("ecx_shape", [base, size, count, device]) stands in for
	// MemDescriptor, then empty, when the request accepted shapes and the
	// producer's region is Count back-to-back blocks. A descriptor costs
	// 14 bytes a block (224 KB for 16,000), and acks carry it until the
	// consumer has completed a READ: every ack of its first batch. Count
	// zero: absent.
	Shape Blocks
	// Touch ("ecx_touch", [base, size, 1, device], as Shape) is, in a
	// contact answer only, a few bytes of the producer's data-plane memory
	// apart from its region, which any consumer may READ: one that does,
	// while it makes contact, has its data plane do the set-up of a first
	// READ there (UCX chooses its protocols on the first) rather than in
	// its first fetch. Count zero: absent.
	Touch Blocks
}

// Token is a grant's capability (ecx_token): 128 random bits.
type Token [16]byte

// IsZero reports whether t is absent.
func (t Token) IsZero() bool { return t == Token{} }

// MemDesc addresses one block of a region: one [addr, size, device_id] triple
// of a mem descriptor.
type MemDesc struct {
	Addr, Size, Device Int
}
