package wire

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ecxfer/ecxfer/internal/wireview"
)

func TestStatus(t *testing.T) {
	tests := []struct {
		s                Status
		name             string
		valid, retryable bool
	}{
		{OK, "OK", true, false},
		{NackMissing, "NACK_MISSING", true, false},
		{NackIncompat, "NACK_INCOMPAT", true, false},
		{NackVersion, "NACK_VERSION", true, false},
		{NackInternal, "NACK_INTERNAL", true, false},
		{NackNotReady, "NACK_NOT_READY", true, true},
		{6, "Status(6)", false, false},
	}
	for i, tt := range tests {
		if i < 6 && int(tt.s) != i {
			t.Errorf("%s = %d, want %d", tt.name, tt.s, i)
		}
		valid := tt.s <= maxStatus
		if tt.s.String() != tt.name || valid != tt.valid || tt.s.Retryable() != tt.retryable {
			t.Errorf("%d: got %s valid=%v retryable=%v", tt.s, tt.s, valid, tt.s.Retryable())
		}
	}
}

func TestInt(t *testing.T) {
	tests := []struct {
		v     Int
		str   string
		i64   bool
		u64   bool
		asInt bool
		neg   bool
	}{
		{IntOf(0), "0", true, true, true, false},
		{IntOf(-1), "-1", true, false, true, true},
		{IntOf(math.MinInt64), "-9223372036854775808", true, false, true, true},
		{UintOf(math.MaxInt64), "9223372036854775807", true, true, true, false},
		{UintOf(1 << 63), "9223372036854775808", false, true, false, false},
		{UintOf(math.MaxUint64), "18446744073709551615", false, true, false, false},
	}
	for _, tt := range tests {
		_, i64 := tt.v.Int64()
		_, u64 := tt.v.Uint64()
		_, asInt := tt.v.Int()
		if tt.v.String() != tt.str || i64 != tt.i64 || u64 != tt.u64 || asInt != tt.asInt || tt.v.neg != tt.neg {
			t.Errorf("%s: int64=%v uint64=%v int=%v neg=%v", tt.v, i64, u64, asInt, tt.v.neg)
		}
	}
}

// The version field: absent means the receiver's default, and the default is
// left off the wire whatever way it was given.
func TestReqVersion(t *testing.T) {
	two, one := IntOf(ConnectorVersion), IntOf(1)
	for _, tt := range []struct {
		v       *Int
		onWire  bool
		decoded Int
	}{{nil, false, two}, {&two, false, two}, {&one, true, one}} {
		r := XferReq{MMHash: "h", CompatibilityHash: "c", ConnectorVersion: tt.v}
		enc := AppendReq(nil, &r)
		if got := strings.Contains(string(enc), "connector_version"); got != tt.onWire {
			t.Errorf("version %v on wire = %v", tt.v, got)
		}
		var back XferReq
		if err := DecodeReq(enc, &back); err != nil {
			t.Fatal(err)
		}
		if back.Version() != tt.decoded || (back.ConnectorVersion == nil) == tt.onWire {
			t.Errorf("version %v decoded as %v (pointer %v)", tt.v, back.Version(), back.ConnectorVersion)
		}
	}
}

// Decoded values never alias the input buffer.
func TestDecodeDoesNotAlias(t *testing.T) {
	ack := XferAck{MMHash: "h", SessionID: "s", SrcBlockIndices: []Int{IntOf(1)}, AgentMetadata: []byte("meta"), MemDescriptor: []byte("desc")}
	buf := AppendAck(nil, &ack)
	var got XferAck
	if err := DecodeAck(buf, &got); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 0
	}
	if got.MMHash != "h" || got.SessionID != "s" || string(got.AgentMetadata) != "meta" || string(got.MemDescriptor) != "desc" {
		t.Fatalf("decoded values changed with the input: %+v", got)
	}
	// Appending to one bytes field must not write into the other.
	_ = append(got.AgentMetadata, 'X')
	if string(got.MemDescriptor) != "desc" {
		t.Fatalf("AgentMetadata and MemDescriptor overlap")
	}
}

// A declared length far beyond the input is refused without allocating it.
func TestHugeDeclaredLengthsDoNotAllocate(t *testing.T) {
	inputs := map[string]string{
		"req str32":        "\x82\xa7mm_hash\xdb\x7f\xff\xff\xff",
		"ack array32":      "\x83\xa7mm_hash\xa1h\xa6status\x00\xb1src_block_indices\xdd\xff\xff\xff\xff\x01",
		"ack bin32":        "\x83\xa7mm_hash\xa1h\xa6status\x00\xaeagent_metadata\xc6\xff\xff\xff\xff",
		"unknown map32":    "\x81\xa1x\xdf\xff\xff\xff\xff",
		"memdesc array32":  "\xdd\xff\xff\xff\xff\x93\x01\x02\x03",
		"top map32":        "\xdf\xff\xff\xff\xff\xa4type\xa3req",
		"unknown ext32":    "\x81\xa1x\xc9\xff\xff\xff\xff\x01",
		"deep unknown arr": "\x81\xa1x" + strings.Repeat("\x91", 100000),
	}
	for name, in := range inputs {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range 100 {
			var r XferReq
			var a XferAck
			e1 := DecodeReq([]byte(in), &r)
			e2 := DecodeAck([]byte(in), &a)
			_, e3 := DecodeMemDescs([]byte(in))
			if !errors.Is(e1, ErrMalformed) && !errors.Is(e2, ErrMalformed) && !errors.Is(e3, ErrMalformed) {
				t.Errorf("%s: no decoder called it malformed: %v / %v / %v", name, e1, e2, e3)
			}
		}
		runtime.ReadMemStats(&after)
		// Each round copies the input three times; anything near a declared
		// length (GiBs) would show.
		if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(100*(8*len(in)+16<<10)); got > limit {
			t.Errorf("%s: allocated %d bytes over 100 rounds, limit %d", name, got, limit)
		}
	}
}

func TestDeepNestingLimit(t *testing.T) {
	nest := func(depth int) []byte {
		b := []byte("\x83\xa7mm_hash\xa1h\xb2compatibility_hash\xa1c\xa1x")
		b = append(b, strings.Repeat("\x91", depth-1)...)
		return append(b, 0x90)
	}
	var r XferReq
	if err := DecodeReq(nest(100), &r); err != nil {
		t.Fatalf("100 levels: %v", err)
	}
	if err := DecodeReq(nest(maxDepth-1), &r); err != nil {
		t.Fatalf("%d levels: %v", maxDepth-1, err)
	}
	if err := DecodeReq(nest(maxDepth), &r); !errors.Is(err, ErrMalformed) {
		t.Fatalf("%d levels: %v", maxDepth, err)
	}
}

func TestMemDescsRoundTrip(t *testing.T) {
	descs := blockDescs(0x7f3a1c000000, 7168, 300, 0)
	enc := AppendMemDescs(nil, descs)
	if got := AppendBlockDescs(nil, 0x7f3a1c000000, 7168, 300, 0); string(got) != string(enc) {
		t.Fatal("AppendBlockDescs differs from AppendMemDescs(BlockDescs)")
	}
	back, err := DecodeMemDescs(enc)
	if err != nil || len(back) != 300 || back[299] != descs[299] {
		t.Fatalf("round trip: %v, %d descs", err, len(back))
	}
	if _, err := DecodeMemDescs([]byte{0x91, 0x92, 0x01, 0x02}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("pair accepted: %v", err)
	}
}

// The views decode without allocating, and agree with the owning decoders.
func TestViewsDoNotAllocate(t *testing.T) {
	reqBytes := AppendReq(nil, &benchReq)
	ackBytes := AppendAck(nil, &benchAck)
	var rv reqView
	var av ackView
	if n := testing.AllocsPerRun(100, func() { decodeReqView(reqBytes, &rv) }); n != 0 {
		t.Fatalf("decodeReqView: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() { decodeAckView(ackBytes, &av) }); n != 0 {
		t.Fatalf("decodeAckView: %v allocs", n)
	}
	var a XferAck
	DecodeAck(ackBytes, &a)
	// Decoding into a used value: decodeAckInto reuses its slices and both
	// keep equal strings; a request for another mm_hash costs that string.
	into := a
	into.SrcBlockIndices = slices.Clone(a.SrcBlockIndices)
	into.AgentMetadata, into.MemDescriptor = slices.Clone(a.AgentMetadata), slices.Clone(a.MemDescriptor)
	if n := testing.AllocsPerRun(100, func() { decodeAckInto(ackBytes, &into) }); n != 0 {
		t.Fatalf("decodeAckInto: %v allocs", n)
	}
	if !sameAck(into, a) {
		t.Fatalf("decodeAckInto: %+v, want %+v", into, a)
	}
	r := benchReq
	if n := testing.AllocsPerRun(100, func() { DecodeReq(reqBytes, &r) }); n != 0 {
		t.Fatalf("DecodeReq into an equal value: %v allocs", n)
	}
	other := benchReq
	other.MMHash = strings.Repeat("4e", 32)
	otherBytes := AppendReq(nil, &other)
	if n := testing.AllocsPerRun(100, func() { r = benchReq; DecodeReq(otherBytes, &r) }); n != 1 {
		t.Fatalf("DecodeReq of another mm_hash: %v allocs", n)
	}
	if !sameReq(r, other) {
		t.Fatalf("DecodeReq: %+v, want %+v", r, other)
	}
	if string(av.MMHash) != a.MMHash || string(av.SessionID) != a.SessionID || av.Status != a.Status ||
		string(av.AgentMetadata) != string(a.AgentMetadata) || string(av.MemDescriptor) != string(a.MemDescriptor) ||
		av.numBlocks() != len(a.SrcBlockIndices) {
		t.Fatal("view and owned decode disagree")
	}
	if got := av.appendBlocks([]Int{IntOf(-1)}); len(got) != 9 || got[1] != a.SrcBlockIndices[0] || got[8] != a.SrcBlockIndices[7] {
		t.Fatalf("AppendBlocks: %v", got)
	}
	if string(rv.MMHash) != benchReq.MMHash || rv.HasVersion || rv.effectiveVersion() != IntOf(ConnectorVersion) {
		t.Fatalf("req view %+v", rv)
	}

	// The sessions' views (internal/wireview), which this package fills.
	var wr wireview.Req
	var wa wireview.Ack
	if n := testing.AllocsPerRun(100, func() { wireview.DecodeReq(reqBytes, &wr) }); n != 0 {
		t.Fatalf("wireview.DecodeReq: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() { wireview.DecodeAck(ackBytes, &wa) }); n != 0 {
		t.Fatalf("wireview.DecodeAck: %v allocs", n)
	}
	if string(wr.MMHash) != benchReq.MMHash || wr.HasVersion || !wr.VersionIs(ConnectorVersion) {
		t.Fatalf("wireview req %+v", wr)
	}
	if string(wa.MMHash) != a.MMHash || Status(wa.Status) != a.Status || wa.Token != a.Token || wa.Grant != a.Grant ||
		string(wa.AgentMetadata) != string(a.AgentMetadata) || wa.NumBlocks != len(a.SrcBlockIndices) {
		t.Fatalf("wireview ack %+v, want %+v", wa, a)
	}
	ids, ok := wireview.AppendBlockIDs(&wa, nil, 1<<30)
	if !ok || len(ids) != len(a.SrcBlockIndices) {
		t.Fatalf("wireview.AppendBlockIDs: %v, %v", ids, ok)
	}
	for i, id := range ids {
		if v, _ := a.SrcBlockIndices[i].Int(); v != id {
			t.Fatalf("wireview.AppendBlockIDs: %v, want %v", ids, a.SrcBlockIndices)
		}
	}
	three := IntOf(3)
	other3 := benchReq
	other3.ConnectorVersion = &three
	if err := wireview.DecodeReq(AppendReq(nil, &other3), &wr); err != nil || !wr.HasVersion || wr.VersionIs(ConnectorVersion) || !wr.VersionIs(3) {
		t.Fatalf("wireview req of version 3: %+v, %v", wr, err)
	}
	if _, ok := wireview.AppendBlockIDs(&wa, nil, 0); ok {
		t.Fatal("wireview.AppendBlockIDs took ids past the limit")
	}
}

// The extensions round-trip between Go peers, stay off the wire when zero
// (the golden vectors cover that encoding), and a wrongly typed extension
// reads as absent, as msgspec treats a field it does not know.
func TestExtensions(t *testing.T) {
	r := XferReq{MMHash: "h", CompatibilityHash: "c", SessionID: "s", VersionOnWire: true, Agent: "agent-1", Attempt: 9}
	enc := AppendReq(nil, &r)
	var rb XferReq
	if err := DecodeReq(enc, &rb); err != nil {
		t.Fatal(err)
	}
	if rb.Agent != "agent-1" || rb.Attempt != 9 || !strings.Contains(string(enc), "connector_version") || rb.Version() != IntOf(ConnectorVersion) {
		t.Errorf("request extensions: %+v from %q", rb, enc)
	}
	a := XferAck{MMHash: "h", SessionID: "s", Grant: 1 << 40, LeaseMillis: 5000, Attempt: 3}
	encA := AppendAck(nil, &a)
	var ab XferAck
	if err := DecodeAck(encA, &ab); err != nil {
		t.Fatal(err)
	}
	if ab.Grant != 1<<40 || ab.LeaseMillis != 5000 || ab.Attempt != 3 {
		t.Errorf("ack extensions: %+v", ab)
	}
	plain := AppendAck(nil, &XferAck{MMHash: "h", SessionID: "s"})
	if strings.Contains(string(plain), "ecx_") {
		t.Errorf("zero extensions on the wire: %q", plain)
	}
	// {"type":"ack","mm_hash":"h","status":0,"ecx_grant":"x","ecx_lease_ms":-1,"ecx_agent":[1]}
	odd := []byte("\x86\xa4type\xa3ack\xa7mm_hash\xa1h\xa6status\x00\xa9ecx_grant\xa1x\xacecx_lease_ms\xff\xa9ecx_agent\x91\x01")
	var ov ackView
	if err := decodeAckView(odd, &ov); err != nil {
		t.Fatalf("wrongly typed extensions refused: %v", err)
	}
	if ov.Grant != 0 || ov.LeaseMillis != 0 {
		t.Errorf("wrongly typed extensions read as %d, %d", ov.Grant, ov.LeaseMillis)
	}
	oddReq := []byte("\x84\xa4type\xa3req\xa7mm_hash\xa1h\xb2compatibility_hash\xa1c\xa9ecx_agent\x05")
	var rv reqView
	if err := decodeReqView(oddReq, &rv); err != nil || len(rv.Agent) != 0 {
		t.Errorf("wrongly typed ecx_agent: %v, %q", err, rv.Agent)
	}
	// Truncated inside an extension is still malformed.
	if err := decodeAckView(encA[:len(encA)-1], &ov); err == nil {
		t.Error("truncated extension accepted")
	}
}

// A shape round-trips, and the shape offer in a request too; a shape that
// is not one (wrong type, length, a zero, a block past the address space,
// more blocks than int32 counts) reads as absent; a truncated one is
// malformed.
func TestShapeExtension(t *testing.T) {
	r := XferReq{MMHash: "h", CompatibilityHash: "c", AcceptsShape: true}
	var rb XferReq
	if err := DecodeReq(AppendReq(nil, &r), &rb); err != nil || !rb.AcceptsShape {
		t.Fatalf("ecx_shape_ok: %v, %+v", err, rb)
	}
	want := Blocks{Base: 1 << 40, Size: 8192, Count: 16000, Device: 3}
	enc := AppendAck(nil, &XferAck{MMHash: "h", Shape: want})
	var a XferAck
	if err := DecodeAck(enc, &a); err != nil || a.Shape != want {
		t.Fatalf("ecx_shape: %v, %+v", err, a.Shape)
	}
	if err := decodeAckView(enc[:len(enc)-1], new(ackView)); err == nil {
		t.Error("truncated shape accepted")
	}
	ack := func(shape string) []byte {
		return []byte("\x84\xa4type\xa3ack\xa7mm_hash\xa1h\xa6status\x00\xa9ecx_shape" + shape)
	}
	for _, odd := range []string{
		"\x93\x01\x01\x01",         // three values
		"\x95\x01\x01\x01\x01\x01", // five
		"\x94\x01\x00\x01\x00",     // size zero
		"\x94\x01\x01\x00\x00",     // count zero
		"\x94\x01\x01\xff\x00",     // a negative count
		"\x94\x01\xa1x\x01\x00",    // a string
		"\x94\xcf\xff\xff\xff\xff\xff\xff\xf0\x00\xcd\x10\x00\x01\x00", // 4096 bytes from 2^64-4096: the end is past 2^64-1
		"\x94\x00\x01\xce\x80\x00\x00\x00\x00",                         // 2^31 blocks
		"\xc3",
	} {
		var v ackView
		if err := decodeAckView(ack(odd), &v); err != nil || v.Shape != (Blocks{}) {
			t.Errorf("shape %q: %v, %+v", odd, err, v.Shape)
		}
	}
	// The largest: 2^31-1 blocks that end at 2^64-1.
	top := Blocks{Base: 1<<64 - 1 - (1<<31-1)*2, Size: 2, Count: 1<<31 - 1}
	var v ackView
	if err := decodeAckView(AppendAck(nil, &XferAck{MMHash: "h", Shape: top}), &v); err != nil || v.Shape != top {
		t.Errorf("largest shape: %v, %+v", err, v.Shape)
	}
	var rv reqView
	if err := decodeReqView([]byte("\x84\xa4type\xa3req\xa7mm_hash\xa1h\xb2compatibility_hash\xa1c\xacecx_shape_ok\x01"), &rv); err != nil || rv.AcceptsShape {
		t.Errorf("ecx_shape_ok 1: %v, %v", err, rv.AcceptsShape)
	}
}

// A touch page round-trips beside a shape, through the view too; one that
// is not a [base, size, count, device] reads as absent, and leaves the
// shape alone.
func TestTouchExtension(t *testing.T) {
	shape := Blocks{Base: 1 << 40, Size: 8192, Count: 16000}
	touch := Blocks{Base: 1<<40 - 4096, Size: 64, Count: 1, Device: 2}
	enc := AppendAck(nil, &XferAck{MMHash: "h", Status: OK, Shape: shape, Touch: touch})
	var a XferAck
	if err := DecodeAck(enc, &a); err != nil || a.Touch != touch || a.Shape != shape {
		t.Fatalf("ecx_touch: %v, %+v", err, a)
	}
	var w wireview.Ack
	if err := wireview.DecodeAck(enc, &w); err != nil || Blocks(w.Touch) != touch || Blocks(w.Shape) != shape {
		t.Fatalf("view: %v, %+v", err, w)
	}
	if err := DecodeAck(AppendAck(nil, &XferAck{MMHash: "h", Status: OK, Shape: shape}), &a); err != nil || a.Touch != (Blocks{}) {
		t.Fatalf("absent touch: %v, %+v", err, a.Touch)
	}
	odd := []byte("\x85\xa4type\xa3ack\xa7mm_hash\xa1h\xa6status\x00\xa9ecx_touch\x93\x01\x01\x01\xa9ecx_shape\x94\x01\x01\x01\x00")
	if err := DecodeAck(odd, &a); err != nil || a.Touch != (Blocks{}) || a.Shape != (Blocks{Base: 1, Size: 1, Count: 1}) {
		t.Fatalf("odd touch: %v, %+v", err, a)
	}
}

// ascii finds a byte with its high bit set at every position of every
// length up to 80 (its 32-, 8- and 1-byte steps), and passes plain ASCII.
func TestASCII(t *testing.T) {
	for n := range 80 {
		s := bytes.Repeat([]byte{'a'}, n)
		if !ascii(s) {
			t.Fatalf("length %d: plain ASCII refused", n)
		}
		for i := range n {
			s[i] = 0x80 | byte(i)
			if ascii(s) {
				t.Fatalf("length %d: byte %#x at %d missed", n, s[i], i)
			}
			if checkUTF8(s, "") == nil && !utf8.Valid(s) {
				t.Fatalf("length %d: invalid UTF-8 accepted", n)
			}
			s[i] = 'a'
		}
	}
}

// An ack's token is 16 bytes of bin on the wire, absent when zero; any
// other value of ecx_token reads as absent.
func TestAckToken(t *testing.T) {
	tok := Token{9, 8, 7, 15: 1}
	a := XferAck{MMHash: "m", Status: OK, SessionID: "s", Grant: 3, Token: tok}
	b := AppendAck(nil, &a)
	var v ackView
	if err := decodeAckView(b, &v); err != nil || v.Token != tok || v.Grant != 3 {
		t.Fatalf("%v %x %d", err, v.Token, v.Grant)
	}
	var back XferAck
	if err := DecodeAck(b, &back); err != nil || back.Token != tok {
		t.Fatalf("%v %x", err, back.Token)
	}
	a.Token = Token{}
	if bytes.Contains(AppendAck(nil, &a), []byte("ecx_token")) {
		t.Fatal("zero token on the wire")
	}
	for _, bad := range [][]byte{{0xc4, 15}, {0xa2, 'h', 'i'}, {0x07}} {
		msg := append([]byte{0x84}, keyType+tagAck+keyMMHash+"\xa1m"+keyStatus+"\x00"+keyToken...)
		if bad[0] == 0xc4 {
			bad = append(bad, make([]byte, 15)...)
		}
		msg = append(msg, bad...)
		if err := decodeAckView(msg, &v); err != nil || !v.Token.IsZero() {
			t.Fatalf("%x: %v %x", msg, err, v.Token)
		}
	}
}

// DecodeBlocks describes a region's descriptor without its list, and
// declines, without an error, every well-formed descriptor that is not
// one region's back-to-back blocks.
func TestDecodeBlocks(t *testing.T) {
	const base = 0x7f3a1c000000
	triple := func(addr, size, dev int64) MemDesc { return MemDesc{IntOf(addr), IntOf(size), IntOf(dev)} }
	region := blockDescs(base, 7168, 256, 0)
	for name, c := range map[string]struct {
		descs []MemDesc
		want  Blocks
		ok    bool
	}{
		"a region":         {region, Blocks{Base: base, Size: 7168, Count: 256}, true},
		"one block":        {region[:1], Blocks{Base: base, Size: 7168, Count: 1}, true},
		"on device 3":      {blockDescs(base, 64, 4, 3), Blocks{Base: base, Size: 64, Count: 4, Device: 3}, true},
		"across 2^32":      {blockDescs(1<<32-2*4096, 4096, 4, 0), Blocks{Base: 1<<32 - 2*4096, Size: 4096, Count: 4}, true},
		"empty":            {nil, Blocks{}, false},
		"out of order":     {append([]MemDesc{region[1], region[0]}, region[2:]...), Blocks{}, false},
		"a gap":            {append(slices.Clone(region[:2]), region[3:]...), Blocks{}, false},
		"sizes differ":     {append(slices.Clone(region[:2]), triple(base+2*7168, 4096, 0)), Blocks{}, false},
		"devices differ":   {append(slices.Clone(region[:2]), triple(base+2*7168, 7168, 1)), Blocks{}, false},
		"negative address": {[]MemDesc{triple(-4096, 4096, 0)}, Blocks{}, false},
		"size zero":        {[]MemDesc{triple(base, 0, 0), triple(base, 0, 0)}, Blocks{}, false},
		"ends past 2^64":   {[]MemDesc{{UintOf(math.MaxUint64 - 4095), UintOf(4096), IntOf(0)}}, Blocks{}, false},
		"wraps around": {[]MemDesc{{UintOf(math.MaxUint64 - 4095), UintOf(4096), IntOf(0)},
			{UintOf(0), UintOf(4096), IntOf(0)}}, Blocks{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok, err := DecodeBlocks(AppendMemDescs(nil, c.descs))
			if err != nil || ok != c.ok || got != c.want {
				t.Fatalf("got %+v, %v, %v; want %+v, %v", got, ok, err, c.want, c.ok)
			}
		})
	}
	// Ints msgpack would write shorter (a 4-byte size) take the general
	// path, and agree.
	wide := []byte{0x92, 0x93, 0xce, 0, 0, 0x10, 0, 0xce, 0, 0, 0x10, 0, 0x00, 0x93, 0xce, 0, 0, 0x20, 0, 0xd1, 0x10, 0, 0x00}
	if got, ok, err := DecodeBlocks(wide); err != nil || !ok || got != (Blocks{Base: 4096, Size: 4096, Count: 2}) {
		t.Errorf("wide ints: %+v, %v, %v", got, ok, err)
	}
	regular := AppendMemDescs(nil, region[:3])
	for _, bad := range [][]byte{{}, {0x91}, {0x91, 0x92, 0x01, 0x02}, {0xc0},
		append(slices.Clone(regular), 0x00), // a region, then a byte
		regular[:len(regular)-1],            // its last int cut short
	} {
		if _, _, err := DecodeBlocks(bad); err == nil {
			t.Errorf("%x: no error", bad)
		} else if _, err2 := DecodeMemDescs(bad); err2 == nil || err.Error() != err2.Error() {
			t.Errorf("%x: %v, DecodeMemDescs says %v", bad, err, err2)
		}
	}
}

// appendIDs writes what appendInt writes, one id after another, whatever
// the widths and the room dst starts with.
func TestAppendIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	widths := []Int{IntOf(0), IntOf(127), IntOf(128), IntOf(255), IntOf(256), IntOf(65535), IntOf(65536),
		IntOf(1 << 40), UintOf(1 << 63), IntOf(-1), IntOf(-33), IntOf(-1 << 40)}
	for n := range 300 {
		vs := make([]Int, n)
		for i := range vs {
			if r.IntN(4) == 0 {
				vs[i] = widths[r.IntN(len(widths))]
			} else {
				vs[i] = IntOf(int64(r.IntN(1 << 16)))
			}
		}
		var want []byte
		for _, v := range vs {
			want = appendInt(want, v)
		}
		dst := make([]byte, 1, 1+r.IntN(8))
		if got := appendIDs(dst, vs); !bytes.Equal(got[1:], want) {
			t.Fatalf("%d ids: %x, want %x", n, got[1:], want)
		}
	}
}

// The contact request and the registered-metadata digest round-trip; a
// value of the wrong type reads as absent; a zero digest stays off the
// wire.
func TestContactAndKnownExtensions(t *testing.T) {
	r := XferReq{MMHash: "ecxfer-contact", CompatibilityHash: "c", SessionID: "s", Attempt: 9, Contact: true, Known: 0x1234567890abcdef}
	var rb XferReq
	if err := DecodeReq(AppendReq(nil, &r), &rb); err != nil || !sameReq(r, rb) {
		t.Fatalf("round trip: %v, %+v", err, rb)
	}
	if bytes.Contains(AppendReq(nil, &XferReq{MMHash: "h", CompatibilityHash: "c"}), []byte("ecx_")) {
		t.Fatal("a plain request carries an extension")
	}
	var rv reqView
	odd := []byte("\x85\xa4type\xa3req\xa7mm_hash\xa1h\xb2compatibility_hash\xa1c\xabecx_contact\x01\xa9ecx_known\xa1x")
	if err := decodeReqView(odd, &rv); err != nil || rv.Contact || rv.Known != 0 {
		t.Errorf("wrong types: %v, %+v", err, rv)
	}
}

// ints converts a slice of ints, appending to dst.
func ints(dst []Int, vs []int) []Int {
	for _, v := range vs {
		dst = append(dst, IntOf(int64(v)))
	}
	return dst
}
