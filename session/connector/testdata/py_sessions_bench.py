"""The reference's sessions over pyzmq, two processes: the Python anchor of
BenchmarkRequestAck.

vLLM's ConsumerSession and ProducerSession are loaded from their docs (the
seed, ../shared/seed, passed as SEED), with the protocol's structs restated
(testdata/python/ec_protocol.py). A ConsumerSession asks a
ProducerSession in a second process for an entry it does not hold, one
request outstanding, and waits for the NACK, as the Go benchmark's Pool asks
its Producer. Both loops sleep in zmq's poll until a message comes, where
the reference's engine loops poll once per step; logging is at WARNING, so
the NACK's INFO line costs only the call. Both favour Python.

Usage: py_sessions_bench.py SEED SECONDS. Prints one JSON line,
{"rtt_per_s": ..., "p50_us": ..., "cpu_us": ...}: cpu_us is the CPU time
(user and system) of both processes per round trip over the timed loop.
Needs msgspec and pyzmq; exits 3 without them.
"""

import json
import logging
import multiprocessing
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "testdata", "python"))
try:
    import zmq
    from ec_protocol import XferAck, XferReq, XferStatus
except ImportError as e:
    print(f"{e.name} is not installed")
    sys.exit(3)


COMPAT = "16" * 32


def load_reference(seed):
    """Runs the session module's code from its docs with the names it
    imports, and returns its namespace."""
    src = open(seed).read()
    src = src[src.index("class ConsumerSession"):]  # after the doc's heading
    logger = logging.getLogger("ec_session")
    logger.setLevel(logging.WARNING)
    ns = {
        "XferReq": XferReq, "XferAck": XferAck, "XferStatus": XferStatus,
        "EC_CONNECTOR_VERSION": XferReq.__struct_defaults__[-1],
        "EXPECTED_NACKS": {XferStatus.NACK_NOT_READY, XferStatus.NACK_MISSING},
        "RETRYABLE_NACKS": {XferStatus.NACK_NOT_READY},
        "PRODUCER_PIN_LEASE_S": 30.0, "_CONSUMER_READ_TIMEOUT_S": 20.0,
        "_CONSUMER_QUARANTINE_TIMEOUT_S": 60.0, "logger": logger,
    }
    prelude = ("from __future__ import annotations\n"
               "import enum, logging, time, uuid\n"
               "from dataclasses import dataclass, field\n"
               "from typing import Any\n"
               "import msgspec\n")
    exec(compile(prelude + src, seed, "exec"), ns)
    return ns


def cpu_self():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cpu_of(pid):
    """A process's user and system time from /proc, in seconds (clock
    ticks: 10 ms at 100 Hz, small beside seconds of round trips)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class NoEntries:
    """The producer's cache: it holds nothing."""

    def pin_if_ready(self, mm_hash):
        return None

    def unpin(self, mm_hash):
        pass


class NoData:
    """A data plane the NACK path never reads from."""

    def get_new_notifs(self):
        return {}


class Router:
    """ZmqServerTransport's part the producer uses: poll and send."""

    def __init__(self, sock):
        self.sock, self.poller = sock, zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)

    def poll(self, timeout_ms):
        out = []
        if self.poller.poll(timeout_ms):
            while True:
                try:
                    identity, payload = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return out
                out.append((identity, payload))
        return out

    def send(self, identity, payload):
        self.sock.send_multipart([identity, payload])

    def close(self):
        self.sock.close(0)


class Dealer:
    """ZmqClientConnection's send."""

    def __init__(self, sock):
        self.sock = sock

    def send(self, payload):
        self.sock.send(payload)


def produce(seed, endpoint_out):
    ref = load_reference(seed)
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoint_out.send(f"tcp://127.0.0.1:{port}")
    router = Router(sock)
    session = ref["ProducerSession"](router, NoData(), NoEntries(), COMPAT)
    while True:
        session.poll(router.poll(timeout_ms=-1))  # wait, then one step


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    seed, seconds = sys.argv[1], float(sys.argv[2])
    ref = load_reference(seed)
    parent, child = multiprocessing.Pipe()
    producer = multiprocessing.Process(target=produce, args=(seed, child), daemon=True)
    producer.start()
    endpoint = parent.recv()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    session = ref["ConsumerSession"](("127.0.0.1", 0), Dealer(sock), None, None, COMPAT)

    def once():
        session.start_xfer("not-held", [0], time.monotonic() + 2)
        while True:
            poller.poll()  # the engine's wait for a reply
            msgs = []
            while True:
                try:
                    msgs.append(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
            session.poll(msgs, time.monotonic())
            r = session.take_results()
            if "not-held" in r.tombstoned:
                return
            if r.completed or r.retryable or r.quarantined:
                sys.exit(f"unexpected results {r}")

    for _ in range(200):
        once()
    lat = []
    cpu0 = cpu_self() + cpu_of(producer.pid)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        once()
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    cpu = cpu_self() + cpu_of(producer.pid) - cpu0
    lat.sort()
    print(json.dumps({"rtt_per_s": len(lat) / elapsed, "p50_us": lat[len(lat) // 2] * 1e6,
                      "cpu_us": cpu / len(lat) * 1e6}))
    producer.terminate()


if __name__ == "__main__":
    main()
