"""The trainer plugin: molt-train rl/sft/eval/serve, engines, actors, algorithms, checkpoints."""
