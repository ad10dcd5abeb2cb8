"""Rollout engines behind the molt_envs.Engine protocol: hf (transformers) and vllm (GPU).

``hf`` and ``vllm`` generate, ``vllm_worker`` runs inside vLLM's worker processes, ``weight_buckets`` packs the
trainer's tensors for the weight sync.

May import: ``molt_train.config`` (the ``--vllm.*`` group), ``molt_train.models``, ``molt_train.routing`` and
``molt_envs``; never the trainers, workers or CLIs, which start the engines.
"""
