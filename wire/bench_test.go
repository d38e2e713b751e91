package wire

import (
	"fmt"
	"strings"
	"testing"
)

// The shapes measured against msgspec (docs/performance.md): a typical request, a
// typical OK ack (8 block ids, 200-byte agent metadata, the 256-block mem
// descriptor), a NACK, the descriptor alone and the compat hash.
var (
	benchReq = XferReq{
		MMHash:            strings.Repeat("3d", 32),
		CompatibilityHash: strings.Repeat("16", 32),
		SessionID:         "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9d",
	}
	benchDesc = AppendBlockDescs(nil, 0x7f3a1c000000, 7168, 256, 0)
	benchAck  = XferAck{
		MMHash:          benchReq.MMHash,
		Status:          OK,
		SessionID:       benchReq.SessionID,
		SrcBlockIndices: ints(nil, []int{10, 11, 12, 13, 14, 15, 16, 17}),
		AgentMetadata:   []byte(strings.Repeat("m", 200)),
		MemDescriptor:   benchDesc,
	}
	benchNack = XferAck{MMHash: benchReq.MMHash, Status: NackNotReady}
)

func BenchmarkReqEncode(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendReq(buf[:0], &benchReq)
	}
}

func BenchmarkReqDecode(b *testing.B) {
	in := AppendReq(nil, &benchReq)
	var r XferReq
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeReq(in, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAckOKEncode(b *testing.B) {
	buf := make([]byte, 0, 8192)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendAck(buf[:0], &benchAck)
	}
}

func BenchmarkAckOKDecode(b *testing.B) {
	in := AppendAck(nil, &benchAck)
	var a XferAck
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeAck(in, &a); err != nil {
			b.Fatal(err)
		}
	}
}

// decodeAckInto into the value it decoded last, as a consumer's loop may.
func BenchmarkAckOKDecodeInto(b *testing.B) {
	in := AppendAck(nil, &benchAck)
	var a XferAck
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeAckInto(in, &a); err != nil {
			b.Fatal(err)
		}
	}
}

// Requests for 64 different entries in turn, into one value, as a
// producer decodes them: the mm_hash is the one string allocated.
func BenchmarkReqDecodeNewHash(b *testing.B) {
	var ins [][]byte
	for i := range 64 {
		r := benchReq
		r.MMHash = fmt.Sprintf("%064x", i)
		ins = append(ins, AppendReq(nil, &r))
	}
	var r XferReq
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := DecodeReq(ins[i%64], &r); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkNackEncode(b *testing.B) {
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendAck(buf[:0], &benchNack)
	}
}

func BenchmarkNackDecode(b *testing.B) {
	in := AppendAck(nil, &benchNack)
	var a XferAck
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeAck(in, &a); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemDesc256Encode(b *testing.B) {
	descs := blockDescs(0x7f3a1c000000, 7168, 256, 0)
	buf := make([]byte, 0, 8192)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendMemDescs(buf[:0], descs)
	}
}

func BenchmarkMemDesc256Decode(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMemDescs(benchDesc); err != nil {
			b.Fatal(err)
		}
	}
}

// A region's descriptor of 16,384 blocks of 4 KiB (what a consumer
// checks on a producer's first ack), as DecodeBlocks reads it.
func BenchmarkDecodeBlocks16k(b *testing.B) {
	desc := AppendBlockDescs(nil, 0x7f12_3456_0000, 4096, 16384, 0)
	b.SetBytes(int64(len(desc)))
	b.ReportAllocs()
	for b.Loop() {
		if bl, ok, err := DecodeBlocks(desc); err != nil || !ok || bl.Count != 16384 {
			b.Fatal(bl, ok, err)
		}
	}
}

func BenchmarkCompatHash(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		CompatHash("0.11.0", "Qwen/Qwen2.5-VL-7B-Instruct", "torch.bfloat16", 7168)
	}
}

func BenchmarkReqDecodeView(b *testing.B) {
	in := AppendReq(nil, &benchReq)
	var r reqView
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeReqView(in, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAckOKDecodeView(b *testing.B) {
	in := AppendAck(nil, &benchAck)
	var a ackView
	var ids []Int
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeAckView(in, &a); err != nil {
			b.Fatal(err)
		}
		ids = a.appendBlocks(ids[:0])
	}
}

func BenchmarkNackDecodeView(b *testing.B) {
	in := AppendAck(nil, &benchNack)
	var a ackView
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeAckView(in, &a); err != nil {
			b.Fatal(err)
		}
	}
}

// A 64 MiB entry of 8 KiB blocks: 8,192 source ids, the second of two
// such entries in a producer's region (ids 8192..16383, uint16 each), as
// the two-process NIXL benchmark fetches; manyBlocksAck is its ack, the
// descriptor left out.
func manyBlocksAck() (ids []int, ack XferAck) {
	ids = make([]int, 8192)
	for i := range ids {
		ids[i] = 8192 + i
	}
	ack = benchAck
	ack.SrcBlockIndices = ints(nil, ids)
	ack.MemDescriptor = nil
	return ids, ack
}

// Decoding and appending walk every id: the time is per ack, about 8,192
// times a single id's.
func BenchmarkAckManyBlocksDecodeView(b *testing.B) {
	_, ack := manyBlocksAck()
	in := AppendAck(nil, &ack)
	var a ackView
	var out []Int
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeAckView(in, &a); err != nil {
			b.Fatal(err)
		}
		out = a.appendBlocks(out[:0])
	}
}

// The same ack's view and its ids as ints in range (AppendBlockIDs), as
// the consumer session reads an OK ack.
func BenchmarkAckManyBlocksIDs(b *testing.B) {
	_, ack := manyBlocksAck()
	in := AppendAck(nil, &ack)
	var a ackView
	var out []int
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeAckView(in, &a); err != nil {
			b.Fatal(err)
		}
		var ok bool
		if out, ok = a.appendBlockIDs(out[:0], 16384); !ok {
			b.Fatal("ids out of range")
		}
	}
}

// The producer's side of it: the entry's blocks as the ack's ids, and the
// ack written.
func BenchmarkAckManyBlocksEncode(b *testing.B) {
	ids, ack := manyBlocksAck()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		ack.SrcBlockIndices = ints(ack.SrcBlockIndices[:0], ids)
		buf = AppendAck(buf[:0], &ack)
	}
}
