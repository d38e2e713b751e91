"""A stand-in for vLLM's Python producer's control plane: a pyzmq ROUTER
(the real libzmq) that answers every XferReq as the reference's rules 1-4
would with an empty cache, msgpack-encoded like msgspec (tag first, defaults
left out). Prints "ready" once bound."""
import sys

import msgpack
import zmq

COMPAT, VERSION = sys.argv[2], 2
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
print("ready", flush=True)
while True:
    ident, empty, payload = sock.recv_multipart()
    req = msgpack.unpackb(payload, raw=False)
    if req.get("connector_version", VERSION) != VERSION:
        status = 3  # NACK_VERSION
    elif req.get("compatibility_hash") != COMPAT:
        status = 2  # NACK_INCOMPAT
    elif not req.get("session_id"):
        status = 4  # NACK_INTERNAL
    else:
        status = 1  # NACK_MISSING: nothing is held
    ack = {"type": "ack", "mm_hash": req["mm_hash"], "status": status}
    sock.send_multipart([ident, b"", msgpack.packb(ack, use_bin_type=True)])
