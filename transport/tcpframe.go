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
//	hello  consumer→producer  name len u16, name            (first frame)
//	hello2 consumer→producer  name len u16, name, token [32] (first frame:
//	                          the consumer mapped the producer's shared
//	                          region and read this token from its header)
//	read   consumer→producer  id u64, notif len u16, n u32, notif, n × block u32
//	                          (notif len's top bit: the consumer dropped
//	                          this grant's push, send the bytes again)
//	done   consumer→producer  id u64                        (all bytes of id landed)
//	notify consumer→producer  notif len u16, notif          (on a hello2
//	                          connection: blocks copied under a grant the
//	                          region's grant table showed live throughout;
//	                          after a stage frame: a push landed)
//	stage  consumer→producer  bytes u32                     (after the hello, to
//	                          a producer whose metadata says "push": the
//	                          consumer keeps this many bytes of pushes, sent
//	                          on this connection; 0: none here, but notify
//	                          frames may come on it)
//	data   producer→consumer  id u64, status u8, len u64, len bytes
//	                          (status copy: no bytes follow, len is the
//	                          region's revocation count at the grant)
//	push   producer→consumer  notif len u16, 0 [6], 0 u8, len u64, notif,
//	                          len/block size × block u32, len bytes (a
//	                          grant's blocks, unasked; see push.go)
//
// A producer answers reads in order. It queues a read's notification only
// when the consumer's done for it arrives, so a notification means every
// byte was delivered.
const (
	frameMagic = "ECX1"

	frameHello  = 1
	frameRead   = 2
	frameDone   = 3
	frameData   = 4
	frameHello2 = 5
	frameNotify = 6
	frameStage  = 7
	framePush   = 8

	dataOK      = 0
	dataRefused = 1 // no live grant covers the blocks
	dataCopy    = 2 // granted and held: copy the blocks from the shared region, then done
	dataPushed  = 3 // pushed ahead on this connection: no bytes follow; done

	tokenLen = 32

	maxNameLen  = 256
	maxNotifLen = 1024
	headLen     = 5 // magic + type
)

var errProtocol = errors.New("transport: data plane protocol error")

func appendHead(b []byte, typ byte) []byte { return append(append(b, frameMagic...), typ) }

func appendHello(b []byte, name string) []byte {
	b = appendHead(b, frameHello)
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

func appendHello2(b []byte, name string, token []byte) []byte {
	b = appendHead(b, frameHello2)
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	return append(append(b, name...), token...)
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
