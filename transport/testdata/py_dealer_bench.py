# Request/reply round trips from a pyzmq DEALER, one outstanding; prints
# round trips per second and the p50 in microseconds as JSON.
# argv: endpoint seconds [serve_endpoint]  (with serve_endpoint it also runs
# a pyzmq ROUTER echo there and measures pyzmq<->pyzmq instead)
import json, sys, threading, time
import zmq

ep, secs = sys.argv[1], float(sys.argv[2])
ctx = zmq.Context()
if len(sys.argv) > 3:
    r = ctx.socket(zmq.ROUTER)
    r.bind(sys.argv[3])
    def serve():
        while True:
            try:
                f = r.recv_multipart()
            except zmq.ZMQError:
                return
            r.send_multipart([f[0], b"", f[2]])
    threading.Thread(target=serve, daemon=True).start()
    ep = sys.argv[3]
d = ctx.socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0)
d.connect(ep)
payload = b"x" * 200
for _ in range(200):
    d.send_multipart([b"", payload]); d.recv_multipart()
lat = []
end = time.perf_counter() + secs
while time.perf_counter() < end:
    t = time.perf_counter()
    d.send_multipart([b"", payload])
    d.recv_multipart()
    lat.append(time.perf_counter() - t)
lat.sort()
print(json.dumps({"rtt_per_s": len(lat) / secs, "p50_us": lat[len(lat) // 2] * 1e6}), flush=True)
import os
os._exit(0)
