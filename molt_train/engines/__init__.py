"""Rollout engines behind the molt_envs.Engine protocol: hf (transformers) and vllm (GPU)."""
