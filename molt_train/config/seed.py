"""The seed README's flags (/work/shared/seeds/molt-README.md: its quick starts, switch tables, scaling knobs and deep
dives), each with what it is here. The README's flag tables mark them "seed" (``python -m molt_train.config``), and
``tests/molt_train/test_seed_flags.py`` checks that every one is accepted by ``molt-train rl`` or ``sft``.

``exists``: the same name and meaning here; ``alias``: accepted under the seed's name for a flag of another name;
``added``: declared for the seed; ``refused``: declared so that a seed command line names it, but it needs what this
trainer does not build or this machine does not have, and a run that gives it exits 2 saying so.
"""

from __future__ import annotations

SEED_FLAGS: dict[str, str] = {
    # the SFT quick start
    "model.model_name_or_path": "alias",  # --actor.model_name_or_path (sft)
    "data.dataset": "alias",  # --data.prompt_dataset
    "data.input_key": "exists",
    "data.output_key": "exists",
    "ckpt.output_dir": "exists",
    "fsdp.attn_implementation": "added",  # sdpa / eager act; flash_attention_2 needs flash-attn, te AutoModel
    # the RL quick start
    "actor.model_name_or_path": "exists",
    "data.prompt_dataset": "exists",
    "train.agent_path": "exists",
    "vllm.num_engines": "exists",
    "vllm.tensor_parallel_size": "exists",
    "rollout.batch_size": "exists",
    "train.batch_size": "exists",
    "train.micro_batch_size": "exists",
    "algo.advantage.estimator": "exists",
    # common RL switches
    "algo.kl.init_coef": "exists",
    "algo.kl.use_loss": "exists",
    "algo.kl.estimator": "exists",
    "algo.kl.ref": "exists",
    "rollout.top_p": "exists",
    "ref.num_nodes": "added",  # only 1: the reference ranks go where the policy's go
    "ref.num_gpus_per_node": "added",  # the reference on GPUs of its own (= --actor.num_workers)
    "train.colocate_fsdp_models": "exists",
    "ref.model_name_or_path": "exists",
    "rollout.n_samples_per_prompt": "exists",
    "actor.loss_agg_mode": "exists",
    "train.async_queue_size": "exists",
    "train.partial_rollout_enable": "exists",
    "algo.dynamic_filtering_enable": "exists",
    "algo.dynamic_filtering_range": "exists",
    "algo.advantage.is_correction_level": "exists",
    "algo.advantage.is_correction_mode": "exists",
    "algo.advantage.is_correction_gating": "exists",
    "algo.advantage.is_correction_threshold": "exists",
    "train.force_on_policy": "added",  # one optimizer step per fresh rollout batch (FlashREINFORCE)
    "algo.advantage.score_centering_top_k": "exists",
    "actor.freeze_moe_router": "exists",
    "eval.temperature": "exists",
    "eval.top_p": "exists",  # now sampled with (it was only recorded)
    "eval.max_new_tokens": "exists",
    "eval.n_samples_per_prompt": "exists",
    "eval.eval_only": "exists",
    "eval.dataset": "exists",
    "train.rollout_dump_dir": "exists",
    "train.rollout_replay_dir": "exists",
    "train.check_weight_update_equal": "exists",
    # scope, algorithms, agents
    "algo.advantage.lam": "exists",
    "critic.value_clip": "exists",
    "critic.adam.lr": "exists",
    "reward.overlong_buffer_len": "exists",
    "reward.overlong_penalty_factor": "exists",
    "reward.stop_properly_penalty_coef": "exists",
    "reward.clip_range": "exists",
    "rollout.max_new_tokens": "exists",
    "data.max_len": "exists",
    # scaling knobs
    "fsdp.tp_size": "exists",
    "fsdp.ep_size": "exists",
    "fsdp.cp_size": "exists",
    "fsdp.offload": "exists",
    "fsdp.packing_samples": "refused",  # sample packing (THD streams) is not built
    "vllm.enable_expert_parallel": "exists",
    "vllm.data_parallel_size": "exists",
    "vllm.max_num_batched_tokens": "exists",
    "vllm.mtp_num_speculative_tokens": "exists",
    "vllm.moe_backend": "added",  # passed to vLLM (untested here: no GPU)
    "train.routing_replay": "exists",
    "data.image_key": "exists",
    # deep dives
    "train.force_sync_mode": "exists",
    "train.batch_invariant": "refused",  # vLLM's batch-invariant kernels are not built (the seed's main lacks them)
    "model.lora_dim": "exists",
    "model.lora_alpha": "exists",
    "model.lora_target_modules": "exists",
    "actor.lora_dim": "alias",  # --model.lora_dim (rl)
    "actor.lora_alpha": "alias",
    "actor.lora_target_modules": "alias",
    "ckpt.save_hf": "exists",
}
