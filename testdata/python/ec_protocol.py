"""vLLM's EC protocol structs (ec_connector/cpu/protocol.py) restated with
its codec settings, as the golden vectors' generator has them: tagged
structs, fields equal to their default left out. wire/testdata's
msgspec_bench.py checks them against the golden vectors. Needs msgspec."""

import enum

import msgspec


class XferStatus(enum.IntEnum):
    OK = 0
    NACK_MISSING = 1
    NACK_INCOMPAT = 2
    NACK_VERSION = 3
    NACK_INTERNAL = 4
    NACK_NOT_READY = 5


class XferReq(msgspec.Struct, tag="req", omit_defaults=True):
    mm_hash: str
    compatibility_hash: str
    session_id: str = ""
    connector_version: int = 2


class XferAck(msgspec.Struct, tag="ack", omit_defaults=True):
    mm_hash: str
    status: XferStatus
    session_id: str = ""
    src_block_indices: list[int] = []
    agent_metadata: bytes = b""
    mem_descriptor: bytes = b""
