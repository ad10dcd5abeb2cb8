"""Length-prefixed JSON frames: the only wire format between the host and a jailed worker.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Never pickle: the
other side is hostile. Binary payloads travel base64-encoded inside the JSON. This module is
stdlib-only because it also runs inside the jail.
"""

from __future__ import annotations

import json
import os
import struct

MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The peer closed the channel or sent something that is not a valid frame."""


# Made once: json.dumps/json.loads build an encoder per call and wrap the C scanner in Python code.
# Fewer objects and pages touched per frame matters in the zygote, where each page it writes while a
# child lives is a copy-on-write fault. The C encoder gets what json.dumps(separators=(",", ":"))
# would pass it (markers, default, string encoder, indent, separators, sort_keys, skipkeys,
# allow_nan), minus the circular-reference check: our messages are trees.
_encode_chunks = json.encoder.c_make_encoder(
    None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
)
_scan = json.JSONDecoder().scan_once


def encode(message: dict) -> bytes:
    body = "".join(_encode_chunks(message, 0)).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte maximum")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict:
    """Exactly one compact JSON value (what `encode` writes; no surrounding whitespace)."""
    try:
        text = body.decode()
        message, end = _scan(text, 0)
    except StopIteration:
        raise FrameError("frame is not JSON") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the C scanner goes
        raise FrameError(f"frame is not JSON: {exc}") from None
    if end != len(text):
        raise FrameError(f"frame has extra data after byte {end}")
    if not isinstance(message, dict):
        raise FrameError(f"frame must hold a JSON object, got {type(message).__name__}")
    return message


def body_length(header: bytes) -> int:
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"frame announces {length} bytes, over the {MAX_FRAME_BYTES}-byte maximum")
    return length


def write_fd(fd: int, message: dict) -> None:
    data = memoryview(encode(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def read_exact_fd(fd: int, n: int) -> bytes:
    chunk = os.read(fd, min(n, 1 << 20))
    if len(chunk) == n:  # the usual case: no list to build
        return chunk
    n -= len(chunk)
    if not chunk:
        raise FrameError("channel closed")
    chunks = [chunk]
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise FrameError("channel closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_body_fd(fd: int) -> bytes:
    """One frame's undecoded JSON body."""
    return read_exact_fd(fd, body_length(read_exact_fd(fd, _HEADER.size)))


def read_fd(fd: int) -> dict:
    return decode_body(read_body_fd(fd))
