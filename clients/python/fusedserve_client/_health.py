"""Minimal grpc.health.v1.Health/Check caller.

The two health messages are tiny (a string field and an enum field), so they
are encoded here by hand rather than depending on grpcio-health-checking,
whose generated grpc.health.v1 symbols would clash in the default descriptor
pool with any other copy of health.proto a program loads.
  HealthCheckRequest  { string service = 1; }
  HealthCheckResponse { ServingStatus status = 1; }  UNKNOWN=0 SERVING=1
                                                     NOT_SERVING=2 SERVICE_UNKNOWN=3
"""

from __future__ import annotations

CHECK_METHOD = "/grpc.health.v1.Health/Check"
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: bytes, i: int):
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint in HealthCheckResponse")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def encode_request(service: str) -> bytes:
    data = service.encode("utf-8")
    return b"\x0a" + _varint(len(data)) + data if data else b""


def decode_response(buf: bytes) -> str:
    status = 0
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
            if field == 1:
                status = value
        elif wire == 1:
            i += 8
        elif wire == 2:
            n, i = _read_varint(buf, i)
            i += n
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unexpected wire type {wire} in HealthCheckResponse")
    return STATUS_NAMES.get(status, f"UNKNOWN({status})")
