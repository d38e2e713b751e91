"""msgspec's decode and encode times for the messages wire/bench_test.go
measures, so the two can be compared in one run (.ci/perf runs both).

vLLM's structs and codec settings restated (testdata/python/ec_protocol.py),
as the golden vectors' generator does: Encoder() for every message, Decoder(XferReq),
Decoder(XferAck) and Decoder(list[tuple[int, int, int]]) (the mem
descriptor), default options. Prints one line per message:
ns/op, best of 7 timeit repeats of about 0.2 s, and the same for a no-op
call (len) on the same buffer, the loop's own overhead.

Usage: msgspec_bench.py [vectors.json [name]]: with the golden vectors,
first checks that the structs write their bytes; with a name, measures
only the rows whose name holds it. Needs msgspec (pip install msgspec);
exits 3 without it.
"""

import json
import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata", "python"))
try:
    import msgspec
    from ec_protocol import XferAck, XferReq, XferStatus
except ImportError:
    print("msgspec is not installed (pip install msgspec)")
    sys.exit(3)


def check_vectors(path):
    """Fails unless these structs write the golden vectors' bytes."""
    enc = msgspec.msgpack.Encoder()
    for v in json.load(open(path)):
        f = v["fields"]
        if v["type"] == "XferReq":
            m = XferReq(f["mm_hash"], f["compatibility_hash"], f["session_id"],
                        int(f["connector_version"]))
        elif v["type"] == "XferAck" and "generated" not in json.dumps(f):
            try:
                status = XferStatus(int(f["status"]))
            except ValueError:
                continue
            m = XferAck(f["mm_hash"], status, f["session_id"],
                        list(f["src_block_indices"]),
                        bytes.fromhex(f["agent_metadata"]),
                        bytes.fromhex(f["mem_descriptor"]))
        else:
            continue
        if enc.encode(m).hex() != v["msgpack_hex"]:
            sys.exit("struct restatement differs from vector " + v["name"])


def ns(stmt, env):
    """Best of seven repeats of about 0.2 s each, in ns per call."""
    timer = timeit.Timer(stmt, globals=env)
    number = max(1000, int(0.2 / (timer.timeit(1000) / 1000)))
    t = timer.repeat(repeat=7, number=number)
    return min(t) / number * 1e9


def main():
    if len(sys.argv) > 1 and sys.argv[1]:
        check_vectors(sys.argv[1])
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    enc = msgspec.msgpack.Encoder()
    req = XferReq("3d" * 32, "16" * 32, "3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9d")
    descs = [(0x7F3A1C000000 + i * 7168, 7168, 0) for i in range(256)]
    desc = enc.encode(descs)
    ack = XferAck(req.mm_hash, XferStatus.OK, req.session_id,
                  list(range(10, 18)), b"m" * 200, desc)
    nack = XferAck(req.mm_hash, XferStatus.NACK_NOT_READY)
    rows = [
        ("ReqDecode", "dreq(b)", req),
        ("AckOKDecode", "dack(b)", ack),
        ("NackDecode", "dack(b)", nack),
        ("ReqEncode", "enc(m)", req),
        ("AckOKEncode", "enc(m)", ack),
        ("NackEncode", "enc(m)", nack),
        ("MemDesc256Decode", "ddesc(b)", descs),
        ("MemDesc256Encode", "enc(m)", descs),
    ]
    for name, stmt, m in rows:
        if only not in name:
            continue
        env = {
            "dreq": msgspec.msgpack.Decoder(XferReq).decode,
            "dack": msgspec.msgpack.Decoder(XferAck).decode,
            "ddesc": msgspec.msgpack.Decoder(list[tuple[int, int, int]]).decode,
            "enc": enc.encode,
            "m": m,
            "b": enc.encode(m),
        }
        t = ns(stmt, env)
        base = ns("len(b)", env)
        print(f"msgspec {name:16s} {t:7.1f} ns/op  (loop and call overhead {base:.1f} ns)")


main()
