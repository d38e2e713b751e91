"""A stand-in for vLLM's Python producer's control plane that grants: a
pyzmq ROUTER (the real libzmq) that answers every XferReq OK as the
reference does (no grant id, token or lease: the notification that ends
the grant is "<session_id>:<mm_hash>"), with the entry's blocks 0..n-1 and
the data-plane agent metadata it is given, after a delay. It prints
"ready" once bound, then "req <session_id> <mm_hash>" for each request.

usage: py_granting_producer.py ENDPOINT COMPAT METADATA_HEX BLOCKS DELAY_MS"""
import sys
import time

import msgpack
import zmq

endpoint, compat, meta = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
blocks, delay = int(sys.argv[4]), int(sys.argv[5]) / 1000.0
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(endpoint)
print("ready", flush=True)
while True:
    ident, empty, payload = sock.recv_multipart()
    req = msgpack.unpackb(payload, raw=False)
    sid = req.get("session_id", "")
    print("req", sid, req["mm_hash"], flush=True)
    if req.get("compatibility_hash") != compat:
        ack = {"type": "ack", "mm_hash": req["mm_hash"], "status": 2}
    else:
        ack = {"type": "ack", "mm_hash": req["mm_hash"], "status": 0, "session_id": sid,
               "src_block_indices": list(range(blocks)), "agent_metadata": meta}
    if delay:
        time.sleep(delay)
    sock.send_multipart([ident, b"", msgpack.packb(ack, use_bin_type=True)])
