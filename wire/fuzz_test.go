package wire

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"slices"
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
	f.Add(AppendReq(nil, &XferReq{MMHash: "h", CompatibilityHash: "c", Agent: "a", Attempt: 2, AcceptsShape: true}))
	f.Add(AppendReq(nil, &XferReq{MMHash: "ecxfer-contact", CompatibilityHash: "c", Attempt: 3, Contact: true, Known: 1 << 40}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r XferReq
		if err := DecodeReq(data, &r); err != nil {
			peekIDs(data, "req") // must not panic either
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

// fuzzUsedAck is an ack decoded before, whose slices decodeAckInto reuses.
func fuzzUsedAck(t *testing.T) XferAck {
	var a XferAck
	if err := DecodeAck(AppendAck(nil, &benchAck), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func FuzzDecodeAck(f *testing.F) {
	seedFuzz(f, "XferAck", "XferAck")
	// Block ids of every width a region's ids take, all in range.
	f.Add(AppendAck(nil, &XferAck{MMHash: "h", Status: OK, SrcBlockIndices: ints(nil, []int{1, 200, 70000, 1 << 31, 5})}))
	f.Add(AppendAck(nil, &XferAck{MMHash: "h", Status: OK, Shape: Blocks{Base: 1 << 40, Size: 8192, Count: 16000}}))
	f.Add(AppendAck(nil, &XferAck{MMHash: "h", Status: OK, Touch: Blocks{Base: 1 << 40, Size: 64, Count: 1}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var a XferAck
		into := fuzzUsedAck(t)
		errInto := decodeAckInto(data, &into)
		if err := DecodeAck(data, &a); err != nil {
			if errInto == nil {
				t.Fatalf("decodeAckInto took what DecodeAck refused: %v", err)
			}
			peekIDs(data, "ack")
			return
		}
		if errInto != nil || !sameAck(a, into) {
			t.Fatalf("decodeAckInto: %v, %+v; DecodeAck: %+v", errInto, into, a)
		}
		if a.Status > maxStatus {
			t.Fatalf("decoded invalid status %d", a.Status)
		}
		checkBlockIDs(t, data, a.SrcBlockIndices)
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

// checkBlockIDs holds AppendBlockIDs to the ids DecodeAck read: all of
// them when each is in [0, limit), none (and false) otherwise, for limits
// around the largest id.
func checkBlockIDs(t *testing.T, data []byte, ids []Int) {
	t.Helper()
	var v ackView
	if err := decodeAckView(data, &v); err != nil {
		t.Fatal(err)
	}
	top := 0
	for _, id := range ids {
		if i, ok := id.Int(); ok && i > top {
			top = i
		}
	}
	for _, limit := range []int{0, 1, top, top + 1, math.MaxInt} {
		prefix := []int{-7}
		got, ok := v.appendBlockIDs(prefix, limit)
		want, wantOK := []int{-7}, true
		for _, id := range ids {
			i, fits := id.Int()
			if !fits || i < 0 || i >= limit {
				want, wantOK = []int{-7}, false
				break
			}
			want = append(want, i)
		}
		if ok != wantOK || !slices.Equal(got, want) {
			t.Fatalf("AppendBlockIDs(limit %d) = %v, %v; ids %v", limit, got, ok, ids)
		}
	}
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
		if ok && !reflect.DeepEqual(d, blockDescs(b.Base, b.Size, b.Count, int64(b.Device))) {
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

// intArraySlow is intArray without its inline forms: every element goes
// through int. The fast loop must agree with it on every input.
func (r *reader) intArraySlow(out []Int) (int, error) {
	n, err := r.blocksHeader()
	if err != nil {
		return 0, err
	}
	for i := uint64(0); i < n; i++ {
		v, c, err := r.int()
		if err != nil {
			if err == errNotInt {
				err = expected("int", c, "$.src_block_indices["+itoa(i)+"]")
			}
			return 0, err
		}
		if out != nil {
			out[i] = v
		}
	}
	return int(n), nil
}

func FuzzIntArray(f *testing.F) {
	f.Add([]byte{0x93, 0x05, 0xcc, 0x80, 0xcd, 0x01, 0x00})
	f.Add([]byte{0x94, 0xce, 0, 1, 0, 0, 0xd0, 0xff, 0xe0, 0xcf, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{0x92, 0xcd, 0x01})             // truncated uint16
	f.Add([]byte{0x92, 0xcc})                   // truncated uint8
	f.Add([]byte{0x92, 0x01, 0xc1})             // bad opcode
	f.Add([]byte{0x92, 0x01, 0xa1, 'x'})        // a str
	f.Add([]byte{0xdc, 0x00, 0x03, 1, 2, 3})    // array16
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}) // a count the input cannot hold
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, slow := reader{b: data}, reader{b: data}
		nf, errf := fast.intArray(nil)
		ns, errs := slow.intArraySlow(nil)
		if nf != ns || fmt.Sprint(errf) != fmt.Sprint(errs) || (errf == nil && fast.i != slow.i) {
			t.Fatalf("check: fast %d %v at %d, slow %d %v at %d", nf, errf, fast.i, ns, errs, slow.i)
		}
		if errf != nil {
			return
		}
		of, os := make([]Int, nf), make([]Int, ns)
		fast, slow = reader{b: data}, reader{b: data}
		fast.intArray(of)
		slow.intArraySlow(os)
		if !reflect.DeepEqual(of, os) {
			t.Fatalf("values: fast %v, slow %v", of, os)
		}
	})
}

// readStr, key, readBin and tag read the common forms inline; what they
// give must be what the general paths give, errors and position included.
func FuzzInline(f *testing.F) {
	f.Add([]byte{0xa3, 'a', 'b', 'c'})
	f.Add([]byte{0xa0})
	f.Add([]byte{0xa3, 'a', 'b'})        // truncated fixstr
	f.Add([]byte{0xd9, 0x02, 'h', 'i'})  // str8
	f.Add([]byte{0xd9})                  // str8 without its length
	f.Add([]byte{0xd9, 0x05, 'h'})       // truncated str8
	f.Add([]byte{0xda, 0x00, 0x01, 'x'}) // str16
	f.Add([]byte{0xa2, 0xc3, 0xa9})      // é
	f.Add([]byte{0xa2, 0xff, 0xfe})      // invalid UTF-8
	f.Add([]byte{0xd9, 0x01, 0x80})      // invalid UTF-8 in a str8
	f.Add([]byte{0xc1})                  // bad opcode
	f.Add([]byte{0xc4, 0x01, 'x'})       // a bin
	f.Add([]byte{0x01})                  // an int
	f.Add([]byte{0xc4, 0x02, 1, 2})      // bin8
	f.Add([]byte{0xc5, 0x00, 0x01, 9})   // bin16
	f.Add([]byte{0xc5, 0x00})            // bin16 without its length
	f.Add([]byte{0xc6, 0, 0, 0, 1, 7})   // bin32
	f.Add([]byte{0xa3, 'r', 'e', 'q'})   // the tags
	f.Add([]byte{0xa3, 'a', 'c', 'k'})
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, slow := reader{b: data}, reader{b: data}
		sf, errf := fast.readStr("$.x")
		ss, errs := slow.readStrSlow("$.x")
		if sf != ss || fmt.Sprint(errf) != fmt.Sprint(errs) || (errf == nil && fast.i != slow.i) {
			t.Fatalf("readStr: fast %v %v at %d, slow %v %v at %d", sf, errf, fast.i, ss, errs, slow.i)
		}
		fast, slow = reader{b: data}, reader{b: data}
		kf, errf := fast.key()
		ks, errs := slow.keySlow()
		if !bytes.Equal(kf, ks) || fmt.Sprint(errf) != fmt.Sprint(errs) || (errf == nil && fast.i != slow.i) {
			t.Fatalf("key: fast %q %v at %d, slow %q %v at %d", kf, errf, fast.i, ks, errs, slow.i)
		}
		fast, slow = reader{b: data}, reader{b: data}
		sf, errf = fast.readBin("$.x")
		ss, errs = slow.readBinSlow("$.x")
		if sf != ss || fmt.Sprint(errf) != fmt.Sprint(errs) || (errf == nil && fast.i != slow.i) {
			t.Fatalf("readBin: fast %v %v at %d, slow %v %v at %d", sf, errf, fast.i, ss, errs, slow.i)
		}
		for _, want := range []string{"req", "ack"} {
			fast, slow = reader{b: data}, reader{b: data}
			errf, errs = fast.tag(want), slow.tagSlow(want)
			if fmt.Sprint(errf) != fmt.Sprint(errs) || (errf == nil && fast.i != slow.i) {
				t.Fatalf("tag %s: fast %v at %d, slow %v at %d", want, errf, fast.i, errs, slow.i)
			}
		}
	})
}
