"""``WeightSyncExtension``: methods vLLM mixes into each of its GPU workers (``worker_extension_cls``).

The engine calls them through ``collective_rpc`` with plain bytes/ints, so nothing here is pickled by vLLM. Every
bucket goes through the model's own ``load_weights`` (vLLM's weight-loading path: HF names in, fused q/k/v and
gate/up shards, tied embeddings handled by the model), never through a checkpoint on disk.

- colocated (same GPU): ``molt_load_ipc_bucket`` opens the trainer's bucket by CUDA IPC (of several payloads of a
  bucket, one per trainer rank, the one on this worker's GPU);
- another GPU: ``molt_init_nccl`` joins a trainer-rank-0 + workers NCCL group once, then
  ``molt_receive_nccl_bucket`` takes one broadcast per bucket;
- ``molt_begin_check`` / ``molt_end_check`` implement ``--train.check_weight_update_equal``: snapshot every
  parameter, poison it, load the trainer's weights again, and name the parameters whose synced value differed
  from the trainer's (stale) or that no tensor reached (uncovered; restored from the snapshot).

Imported only inside vLLM's worker process (it imports vllm lazily all the same).
"""

from __future__ import annotations

import pickle
import time

import torch

from molt_train.engines.weight_buckets import TensorMeta, open_shared, unpack


class WeightSyncExtension:
    # -- loading --
    def _molt_load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        loaded = self.model_runner.model.load_weights(weights)
        if loaded is not None:
            self.__dict__.setdefault("_molt_loaded", set()).update(loaded)

    def molt_load_ipc_bucket(self, payload: bytes) -> float:
        """Load one CUDA-IPC bucket; returns seconds spent in this worker."""
        start = time.perf_counter()
        buffer, metas = open_shared(payload)
        self._molt_load(unpack(buffer, metas))
        torch.cuda.synchronize()
        del buffer
        return time.perf_counter() - start

    def molt_init_nccl(self, host: str, port: int, rank_offset: int, world_size: int) -> int:
        """Join the trainer's weight-sync group (trainer = rank 0); returns this worker's rank in it."""
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        # data-parallel replica d's workers come after replica 0..d-1's (self.rank counts within one replica)
        parallel = self.vllm_config.parallel_config
        rank = rank_offset + (parallel.data_parallel_rank or 0) * parallel.world_size + self.rank
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self._molt_nccl = PyNcclCommunicator(group, device=self.device)
        return rank

    def molt_receive_nccl_bucket(self, metas: bytes, nbytes: int) -> float:
        """Receive one broadcast bucket from rank 0 and load it; returns seconds spent in this worker."""
        if getattr(self, "_molt_nccl", None) is None:
            raise RuntimeError("molt_init_nccl was never called on this worker: no weight-sync group to receive from")
        start = time.perf_counter()
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._molt_nccl.broadcast(buffer, src=0, stream=torch.cuda.current_stream())
        self._molt_load(unpack(buffer, [TensorMeta.from_tuple(m) for m in pickle.loads(metas)]))
        torch.cuda.synchronize()
        return time.perf_counter() - start

    # -- coverage and equality --
    def molt_reset_loaded(self) -> None:
        self._molt_loaded = set()

    def molt_uncovered(self) -> list[str]:
        """Parameters no ``load_weights`` call reported since the last ``molt_reset_loaded``."""
        loaded = getattr(self, "_molt_loaded", set())
        return sorted(n for n, _ in self.model_runner.model.named_parameters() if n not in loaded)

    def molt_begin_check(self) -> int:
        """Snapshot every parameter (in host memory: a colocated trainer leaves no room for a second copy on the GPU)
        and fill it with NaN; returns the number of parameters."""
        params = dict(self.model_runner.model.named_parameters())
        self._molt_snapshot = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        with torch.no_grad():
            for p in params.values():
                p.fill_(float("nan"))
        return len(params)

    def molt_end_check(self) -> dict[str, list[str]]:
        """After the trainer's weights were loaded again: ``stale`` (synced value != trainer's) and ``uncovered``
        (no tensor reached it, wholly or in part; the synced value is put back). Frees the snapshot."""
        snapshot = self.__dict__.pop("_molt_snapshot", None)
        if snapshot is None:
            raise RuntimeError("molt_end_check without molt_begin_check")
        stale, uncovered = [], []
        with torch.no_grad():
            for name, param in self.model_runner.model.named_parameters():
                old = snapshot[name].to(param.device)  # one parameter at a time back on the GPU
                if torch.isnan(param).any() and not torch.isnan(old).any():
                    uncovered.append(name)
                    param.copy_(old)
                elif not torch.equal(param.reshape(-1).view(torch.uint8), old.reshape(-1).view(torch.uint8)):
                    stale.append(name)  # bitwise: NaN == NaN, and -0.0 != 0.0
        torch.cuda.synchronize()
        return {"stale": stale, "uncovered": uncovered}
