"""``molt-train``: one command, sub-commands in their own modules (imported only when used)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "demo": ("molt_train.demo", "the embedded-default demo (what `make demo` runs)"),
    "rl": ("molt_train.rl_cli", "online RL on a registered env: --env ns/name-v1"),
    "sft": ("molt_train.sft_cli", "supervised fine-tuning on an env's reference completions"),
    "eval": ("molt_train.eval_cli", "evaluate a checkpoint on an env split"),
    "report": ("molt_train.report", "plot a run's metrics to report.png"),
    "serve": ("molt_train.serve_cli", "the OpenAI/Anthropic session server in front of a model"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: molt-train COMMAND [flags]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
