package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The TCP data plane's frames. Every frame starts with the 4-byte magic and
// a type byte; integers are big-endian.
//
//	hello   consumer→producer  name len u16, name, push room u32,
//	                           challenge [16]                    (first frame)
//	welcome producer→consumer  proof [32]                        (first frame)
//	read    consumer→producer  id u64, notif len u16, n u32, notif, n × block u32
//	                           (notif len's top bit: the consumer dropped
//	                           this grant's push, send the bytes)
//	done    consumer→producer  id u64                 (every byte of id landed)
//	notify  consumer→producer  notif len u16, notif   (a READ landed from the
//	                           producer's shared region or from a push)
//	data    producer→consumer  id u64, status u8, len u64, len bytes
//	                           (status pushed: the grant's blocks were
//	                           pushed on this connection before it, and no
//	                           bytes follow)
//	push    producer→consumer  notif len u16, n u32, len u64, notif,
//	                           n × block u32, len bytes (a grant's blocks,
//	                           unasked: see push.go)
//
// The hello names the consumer (a label for logs), says how many bytes of
// pushes it keeps for this connection (0: none), and carries a random
// challenge when the consumer mapped the producer's shared region: the
// welcome answers it with HMAC-SHA256 keyed with the region's token over
// the challenge, the producer's advertised address and its incarnation (as
// its metadata gives them), which only the region's owner can compute, and
// which a relay at another address cannot pass on as its own (see
// samehost.go). Every read and notify presents the grant's token inside
// its notification ("<session>:<mm_hash>#<grant>.<token>"), which the
// producer's session checks: a connection is never trusted for the name it
// gives.
//
// A producer answers reads in order. It queues a read's notification only
// when the consumer's done for it arrives, so a notification means every
// byte was delivered. A consumer lands a read only once it wrote its done:
// a read whose connection closes before its done arrived either failed on
// the consumer, or landed every byte already; the producer's session ends
// its grant either way (see plane.Attachment.Broken).
const (
	frameMagic = "ECX2"

	frameHello   = 1
	frameRead    = 2
	frameDone    = 3
	frameData    = 4
	frameWelcome = 5
	frameNotify  = 6
	framePush    = 8

	dataOK      = 0
	dataRefused = 1 // no live grant covers the blocks
	dataPushed  = 2 // pushed ahead on this connection: no bytes follow

	challengeLen = 16
	proofLen     = 32

	maxNameLen  = 256
	maxNotifLen = 1024
	headLen     = 5 // magic + type
)

var errProtocol = errors.New("transport: data plane protocol error")

func appendHead(b []byte, typ byte) []byte { return append(append(b, frameMagic...), typ) }

func appendHello(b []byte, name string, room uint32, challenge []byte) []byte {
	b = appendHead(b, frameHello)
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, room)
	if challenge == nil {
		return append(b, make([]byte, challengeLen)...)
	}
	return append(b, challenge...)
}

func appendWelcome(b []byte, proof []byte) []byte {
	b = appendHead(b, frameWelcome)
	if proof == nil {
		return append(b, make([]byte, proofLen)...)
	}
	return append(b, proof...)
}

// readResend is the READ frame's flag, in notif len's top bit.
const readResend = 1 << 15

// appendRead appends a READ of n blocks, remote given as runs (spans).
func appendRead(b []byte, id uint64, notif []byte, n int, remote [][2]int, resend bool) []byte {
	b = appendHead(b, frameRead)
	b = binary.BigEndian.AppendUint64(b, id)
	nl := uint16(len(notif))
	if resend {
		nl |= readResend
	}
	b = binary.BigEndian.AppendUint16(b, nl)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	b = append(b, notif...)
	for _, r := range remote {
		for id := r[0]; id < r[0]+r[1]; id++ {
			b = binary.BigEndian.AppendUint32(b, uint32(id))
		}
	}
	return b
}

func appendDone(b []byte, id uint64) []byte {
	b = appendHead(b, frameDone)
	return binary.BigEndian.AppendUint64(b, id)
}

func appendNotify(b []byte, notif []byte) []byte {
	b = appendHead(b, frameNotify)
	b = binary.BigEndian.AppendUint16(b, uint16(len(notif)))
	return append(b, notif...)
}

func appendDataHead(b []byte, id uint64, status byte, n uint64) []byte {
	b = appendHead(b, frameData)
	b = binary.BigEndian.AppendUint64(b, id)
	b = append(b, status)
	return binary.BigEndian.AppendUint64(b, n)
}

// appendPushHead appends a push's head, its notification and its blocks.
func appendPushHead(b []byte, notif []byte, size uint64, blocks []int) []byte {
	b = appendHead(b, framePush)
	b = binary.BigEndian.AppendUint16(b, uint16(len(notif)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(blocks)))
	b = binary.BigEndian.AppendUint64(b, size)
	b = append(b, notif...)
	for _, id := range blocks {
		b = binary.BigEndian.AppendUint32(b, uint32(id))
	}
	return b
}

// readHead reads a frame's magic and type.
func readHead(r io.Reader, buf []byte) (byte, error) {
	if _, err := io.ReadFull(r, buf[:headLen]); err != nil {
		return 0, err
	}
	if string(buf[:4]) != frameMagic {
		return 0, fmt.Errorf("%w: bad magic %q", errProtocol, buf[:4])
	}
	return buf[4], nil
}

// readLen reads a frame's u16 length into buf; false: it could not, or the
// length is over max.
func readLen(r io.Reader, buf []byte, max int) (int, bool) {
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return 0, false
	}
	n := int(binary.BigEndian.Uint16(buf[:2]))
	return n, n <= max
}

// readIDs reads n block ids, each below limit, appending them to dst; a
// chunk at a time through scratch, so that what a peer declares is never
// allocated before it arrives. false: a read failed or an id is out of
// range.
func readIDs(r io.Reader, dst []int, n, limit int, scratch []byte) ([]int, bool) {
	for n > 0 {
		k := min(n, len(scratch)/4)
		if _, err := io.ReadFull(r, scratch[:4*k]); err != nil {
			return dst, false
		}
		for j := range k {
			b := int(binary.BigEndian.Uint32(scratch[4*j:]))
			if b >= limit {
				return dst, false
			}
			dst = append(dst, b)
		}
		n -= k
	}
	return dst, true
}

// spans groups block ids into runs of consecutive ids: [start, count) pairs
// appended to dst, so that contiguous blocks move in one read or write.
func spans(dst [][2]int, ids []int) [][2]int {
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && ids[j] == ids[j-1]+1 {
			j++
		}
		dst = append(dst, [2]int{ids[i], j - i})
		i = j
	}
	return dst
}
