"""Packed weight buckets: how trainer tensors travel to a rollout engine in a few large transfers.

A sync never moves one tensor per call (per-parameter RPCs are what make weight sync slow elsewhere). The named
tensors are copied, in order, into contiguous ``uint8`` buffers of at most ``bucket_bytes`` (one oversized tensor
gets a bucket of its own); each tensor starts on an ``ALIGN``-byte boundary so the receiver can view it in place.
A bucket travels as one CUDA IPC handle (same GPU, colocated) or one NCCL broadcast (another GPU); ``TensorMeta``
says where each tensor lies in it.

``share``/``open_shared`` wrap the CUDA IPC handle of a bucket into plain bytes (pickle: the payload only ever goes
from our trainer process to our own engine worker).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from molt_train.config.engine import BUCKET_BYTES

ALIGN = 256


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the bucket
    nbytes: int

    def as_tuple(self) -> tuple:
        return self.name, self.dtype, list(self.shape), self.offset, self.nbytes

    @classmethod
    def from_tuple(cls, value: tuple | list) -> TensorMeta:
        name, dtype, shape, offset, nbytes = value
        return cls(name, dtype, tuple(shape), int(offset), int(nbytes))


@dataclass
class Bucket:
    buffer: torch.Tensor  # uint8, 1-D
    metas: list[TensorMeta]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.metas)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
) -> list[list[tuple[TensorMeta, torch.Tensor]]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (aligned offsets)."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes must be at least {ALIGN}, got {bucket_bytes}")
    buckets: list[list[tuple[TensorMeta, torch.Tensor]]] = []
    current: list[tuple[TensorMeta, torch.Tensor]] = []
    used = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        offset = _aligned(used)
        if current and offset + nbytes > bucket_bytes:
            buckets.append(current)
            current, offset = [], 0
        dtype = str(tensor.dtype).removeprefix("torch.")
        current.append((TensorMeta(name, dtype, tuple(tensor.shape), offset, nbytes), tensor))
        used = offset + nbytes
    if current:
        buckets.append(current)
    return buckets


def pack(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = BUCKET_BYTES,
    device: torch.device | str | None = None,
) -> Iterator[Bucket]:
    """Yield filled buckets one at a time (at most one bucket of extra memory alive if the caller drops each)."""
    for planned in plan_buckets(named_tensors, bucket_bytes):
        last = planned[-1][0]
        target = device if device is not None else planned[0][1].device
        buffer = torch.empty(last.offset + last.nbytes, dtype=torch.uint8, device=target)
        for meta, tensor in planned:
            flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
            buffer[meta.offset : meta.offset + meta.nbytes].copy_(flat, non_blocking=True)
        yield Bucket(buffer, [meta for meta, _ in planned])


def unpack(buffer: torch.Tensor, metas: Iterable[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
    """Views of the bucket's tensors (no copy): valid while ``buffer`` is."""
    out = []
    for m in metas:
        if m.offset + m.nbytes > buffer.numel():
            raise ValueError(
                f"tensor {m.name!r} ends at byte {m.offset + m.nbytes}, past the bucket's "
                f"{buffer.numel()} bytes: the metadata does not belong to this bucket"
            )
        dtype = getattr(torch, m.dtype)
        out.append((m.name, buffer[m.offset : m.offset + m.nbytes].view(dtype).view(m.shape)))
    return out


def share(bucket: Bucket) -> bytes:
    """Bytes that let a process on the same GPU open ``bucket`` without a copy (CUDA IPC).

    The caller keeps ``bucket`` alive until the receiver is done with it.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    if not bucket.buffer.is_cuda:
        raise ValueError("only CUDA buckets can be shared through CUDA IPC; move the weights to the GPU first")
    torch.cuda.current_stream(bucket.buffer.device).synchronize()  # the copies into the bucket are done
    _, args = reduce_tensor(bucket.buffer)
    uuid = str(torch.cuda.get_device_properties(bucket.buffer.device).uuid)
    return pickle.dumps((uuid, args, [m.as_tuple() for m in bucket.metas]))


def open_shared(payload: bytes | Sequence[bytes]) -> tuple[torch.Tensor, list[TensorMeta]]:
    """The receiver's side of ``share``: the bucket's buffer and its metadata. ``payload``: one bucket shared from
    one GPU, or the same bucket shared from several (one per trainer rank): the one of this process's current GPU
    is opened, else one of another GPU this process sees (its tensors then live there; loading copies them over).

    Raises:
        RuntimeError: no payload comes from a GPU this process sees.
    """
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    shared = [pickle.loads(p) for p in ([payload] if isinstance(payload, bytes) else payload)]
    current = torch.cuda.current_device()
    visible = {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}
    here = [s for s in shared if visible.get(s[0]) == current] or [s for s in shared if s[0] in visible]
    if not here:
        raise RuntimeError(
            f"CUDA IPC bucket comes from GPU(s) {[s[0] for s in shared]} but this engine worker sees only "
            f"{sorted(visible)}: colocated sync needs trainer and engine on the same GPUs; use the NCCL path otherwise"
        )
    uuid, args, metas = here[0]
    args = list(args)
    args[6] = visible[uuid]  # the device index as this process numbers it
    return rebuild_cuda_tensor(*args), [TensorMeta.from_tuple(m) for m in metas]
