# A vLLM-style DEALER: heartbeat options, a disconnect monitor. It sends a
# request, idles, sends another, and prints what it saw as JSON.
# argv: endpoint ivl_ms timeout_ms ttl_ms idle_s
import json, sys, time
import zmq
from zmq.utils.monitor import recv_monitor_message

ep, ivl, tmo, ttl, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.HEARTBEAT_IVL, ivl)
s.setsockopt(zmq.HEARTBEAT_TIMEOUT, tmo)
s.setsockopt(zmq.HEARTBEAT_TTL, ttl)
s.setsockopt(zmq.LINGER, 0)
mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
s.connect(ep)
out = {"disconnects": 0, "replies": []}
def recv_reply():
    if s.poll(5000):
        out["replies"].append([f.decode() for f in s.recv_multipart()])
s.send_multipart([b"", b"one"])
recv_reply()
end = time.time() + idle
while time.time() < end:
    if mon.poll(50):
        recv_monitor_message(mon)
        out["disconnects"] += 1
s.send_multipart([b"", b"two"])
recv_reply()
while mon.poll(0):
    recv_monitor_message(mon)
    out["disconnects"] += 1
print(json.dumps(out), flush=True)
s.disable_monitor()
mon.close(0)
s.close(0)
ctx.term()
