# A plain libzmq ROUTER (as vLLM's producer binds it) answering every
# [id, "", payload] with [id, "", "re:" + payload]. Prints "ready" once bound.
# argv: endpoint
import sys
import zmq

ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.setsockopt(zmq.LINGER, 0)
s.bind(sys.argv[1])
print("ready", flush=True)
while True:
    frames = s.recv_multipart()
    if len(frames) == 3:
        s.send_multipart([frames[0], b"", b"re:" + frames[2]])
