"""The wire format: compact JSON frames, decoded strictly (the other side may be hostile)."""

from __future__ import annotations

import json

import pytest

from sandboxes.injail import frames


def test_encodes_what_json_dumps_compact_does():
    message = {"b": [1.5, float("inf"), None, True], "a": {"é": "\u2028\n"}, "n": -(2**70)}
    assert frames.encode(message)[4:] == json.dumps(message, separators=(",", ":")).encode()


def test_round_trip():
    message = {"op": "python", "limits": {"wall_s": 1.5, "cpu_s": None}, "ok": True, "text": "é\n\u2028", "n": [1, -2]}
    data = frames.encode(message)
    assert b" " not in data and frames.body_length(data[:4]) == len(data) - 4
    assert frames.decode_body(data[4:]) == message
    assert frames.decode_body(bytearray(data[4:])) == message  # the host decodes from its read buffer


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[1]", b"null", b'{"a":1} ', b'{"a":1}{}', b' {"a":1}', b"\xff{}", b"[" * 100_000, b'{"a":' * 100_000],
)
def test_rejects_anything_but_one_object(body):
    with pytest.raises(frames.FrameError):
        frames.decode_body(body)


def test_refuses_what_json_cannot_carry():
    with pytest.raises(TypeError):
        frames.encode({"data": b"raw bytes"})
