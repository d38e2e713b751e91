package wire

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"testing"
)

// seedFuzz adds every golden input of the given kind to f.
func seedFuzz(f *testing.F, vectorType, target string) {
	var vectors []vector
	loadJSON(f, "vectors.json", &vectors)
	for _, v := range vectors {
		if v.Type == vectorType && v.MsgpackHex != nil {
			b, _ := hex.DecodeString(*v.MsgpackHex)
			f.Add(b)
		}
	}
	var cases []decodeCase
	loadJSON(f, "decode_cases.json", &cases)
	for _, c := range cases {
		if c.Target == target {
			b, _ := hex.DecodeString(c.InputHex)
			f.Add(b)
		}
	}
}

func FuzzDecodeReq(f *testing.F) {
	seedFuzz(f, "XferReq", "XferReq")
	f.Fuzz(func(t *testing.T, data []byte) {
		var r XferReq
		if err := DecodeReq(data, &r); err != nil {
			PeekIDs(data, "req") // must not panic either
			return
		}
		enc := AppendReq(nil, &r)
		var r2 XferReq
		if err := DecodeReq(enc, &r2); err != nil {
			t.Fatalf("re-decode of %x: %v", enc, err)
		}
		if !sameReq(r, r2) {
			t.Fatalf("unstable: %+v then %+v", r, r2)
		}
		if enc2 := AppendReq(nil, &r2); !bytes.Equal(enc, enc2) {
			t.Fatalf("re-encode differs: %x then %x", enc, enc2)
		}
	})
}

// fuzzUsedAck is an ack decoded before, whose slices DecodeAckInto reuses.
func fuzzUsedAck(t *testing.T) XferAck {
	var a XferAck
	if err := DecodeAck(AppendAck(nil, &benchAck), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func FuzzDecodeAck(f *testing.F) {
	seedFuzz(f, "XferAck", "XferAck")
	f.Fuzz(func(t *testing.T, data []byte) {
		var a XferAck
		into := fuzzUsedAck(t)
		errInto := DecodeAckInto(data, &into)
		if err := DecodeAck(data, &a); err != nil {
			if errInto == nil {
				t.Fatalf("DecodeAckInto took what DecodeAck refused: %v", err)
			}
			PeekIDs(data, "ack")
			return
		}
		if errInto != nil || !sameAck(a, into) {
			t.Fatalf("DecodeAckInto: %v, %+v; DecodeAck: %+v", errInto, into, a)
		}
		if !a.Status.Valid() {
			t.Fatalf("decoded invalid status %d", a.Status)
		}
		enc := AppendAck(nil, &a)
		var a2 XferAck
		if err := DecodeAck(enc, &a2); err != nil {
			t.Fatalf("re-decode of %x: %v", enc, err)
		}
		if !sameAck(a, a2) {
			t.Fatalf("unstable: %+v then %+v", a, a2)
		}
		if enc2 := AppendAck(nil, &a2); !bytes.Equal(enc, enc2) {
			t.Fatalf("re-encode differs: %x then %x", enc, enc2)
		}
	})
}

func FuzzDecodeMemDescs(f *testing.F) {
	seedFuzz(f, "MemDescriptor", "MemDescriptor")
	f.Add(AppendBlockDescs(nil, 1<<40, 4096, 5, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeMemDescs(data)
		b, ok, berr := DecodeBlocks(data)
		if (err == nil) != (berr == nil) {
			t.Fatalf("DecodeMemDescs: %v; DecodeBlocks: %v", err, berr)
		}
		if err != nil {
			return
		}
		if ok && !reflect.DeepEqual(d, BlockDescs(b.Base, b.Size, b.Count, int64(b.Device))) {
			t.Fatalf("%+v does not describe %v", b, d)
		}
		enc := AppendMemDescs(nil, d)
		d2, err := DecodeMemDescs(enc)
		if err != nil {
			t.Fatalf("re-decode of %x: %v", enc, err)
		}
		if len(d) != len(d2) || (len(d) > 0 && !reflect.DeepEqual(d, d2)) {
			t.Fatalf("unstable: %v then %v", d, d2)
		}
	})
}
