"""``molt/harness-claude-code-v1`` and ``molt/harness-codex-v1``: the real Claude Code and Codex CLIs as ChatAgents.

Each episode runs the harness non-interactively (``claude -p``, ``codex exec``) in a fresh jail (``molt_envs.harness``)
on a task from the dataset: compute a product and write it into ``answer.txt``. The grader reads the final
workspace: reward 1 when ``answer.txt`` holds the number, else 0 (``info`` also says whether the final answer text
named it). Telemetry, auto-update, error reporting and every other call home are switched off through the CLIs'
documented environment variables and config, and the jail has no network but the loopback to the session anyway.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

from molt_envs.contract import ChatContext, Result
from molt_envs.harness import JAIL_WORK, HarnessAgent, HarnessRun

TASK = "Compute {a} * {b} and write just the resulting number into a file named answer.txt in the current directory."
SYSTEM_PROMPT = "You are a coding agent in a sandbox. Use your tools to do the task, then say briefly what you did."


def generate_split(split: str, size: int = 1000, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Rows ``{"question", "answer"}``; the test split draws from another seed stream."""
    rng = random.Random(f"harness:{seed}:{split}")
    for _ in range(size):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        yield {"question": TASK.format(a=a, b=b), "answer": str(a * b)}


class _AnswerFileTask(HarnessAgent):
    graded_files = ("answer.txt",)

    def grade(self, ctx: ChatContext, run: HarnessRun) -> Result:
        content = run.files["answer.txt"]
        correct = float(content is not None and content.strip() == str(ctx.label))
        named = float(re.search(rf"(?<!\d){re.escape(str(ctx.label))}(?!\d)", run.final_text) is not None)
        info = {
            "file_correct": correct,
            "file_written": float(content is not None),
            "answer_in_reply": named,
            "jail_leftovers": float(len(run.leftovers)),
            "exit_code": float(run.exit_code),
        }
        return Result(reward=correct, info=info)


class ClaudeCodeAgent(_AnswerFileTask):
    """``claude -p TASK`` (npm ``@anthropic-ai/claude-code``) on the Anthropic wire.

    Args:
        tools: the built-in tools offered (``--tools``).
        system_prompt: replaces Claude Code's own (``--system-prompt``); None keeps its own, which is long.
        bare: ``--bare`` (no hooks, plugins, CLAUDE.md discovery, auto-memory or background prefetches).
        max_turns: ``--max-turns``: agentic turns before Claude Code stops by itself.
        **kwargs: ``HarnessAgent``'s (install_dir, timeout_s, memory_mb).
    """

    def __init__(
        self,
        tools: str = "Bash,Read,Write",
        system_prompt: str | None = SYSTEM_PROMPT,
        bare: bool = True,
        max_turns: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tools, self.system_prompt, self.bare, self.max_turns = tools, system_prompt, bare, max_turns

    def command(self, ctx: ChatContext, base_url: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
        argv = [self.executable("@anthropic-ai", "claude-code", "bin", "claude.exe"), "-p", ctx.prompt]
        argv += ["--model", ctx.model_name, "--output-format", "json", "--tools", self.tools]
        argv += ["--max-turns", str(self.max_turns), "--dangerously-skip-permissions", "--no-session-persistence"]
        if self.bare:
            argv.append("--bare")
        if self.system_prompt is not None:
            argv += ["--system-prompt", self.system_prompt]
        env = {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "CLAUDE_CONFIG_DIR": f"{JAIL_WORK}/home/.claude",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(ctx.sampling_params.max_tokens),
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(ctx.max_length),
            # no telemetry, error reports, auto-update, feedback surveys or side calls (titles, tips)
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        }
        return argv, env, {}

    def final_text(self, run: HarnessRun) -> str:
        try:  # --output-format json: one object whose "result" is the final answer
            return str(json.loads(run.stdout.strip().splitlines()[-1]).get("result") or "")
        except (IndexError, ValueError, AttributeError):
            return run.stdout


# Codex's prompt parts a one-shot task has no use for: multi-agent and goal tools, image viewing, request_user_input,
# the bundled skills' instructions, the permissions preamble. With the test tokenizer they take its prompt from about
# 12.3k tokens to 2.1k (the exec_command and write_stdin tools, the environment context and the task remain).
CODEX_LEAN = [
    "include_permissions_instructions = false",
    "skills.include_instructions = false",
    "skills.bundled.enabled = false",
    "tools.experimental_request_user_input.enabled = false",
    "features.multi_agent = false",
    "features.goals = false",
    "features.view_image = false",
]
# no telemetry, feedback, update checks, web search, apps or plugins (their start-up syncs call home)
CODEX_QUIET = [
    "check_for_update_on_startup = false",
    'web_search = "disabled"',
    "analytics.enabled = false",
    "feedback.enabled = false",
    'otel.exporter = "none"',
    "features.apps = false",
    "features.plugins = false",
]


class CodexAgent(_AnswerFileTask):
    """``codex exec TASK`` (npm ``@openai/codex``) on the Responses wire, through a custom model provider.

    Args:
        instructions: replaces Codex's own base instructions (``model_instructions_file``); None keeps its own.
        lean: leave out the prompt parts in ``CODEX_LEAN`` (about 10k tokens of tools and instructions).
        **kwargs: ``HarnessAgent``'s (install_dir, timeout_s, memory_mb).
    """

    def __init__(self, instructions: str | None = SYSTEM_PROMPT, lean: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.instructions, self.lean = instructions, lean

    def command(self, ctx: ChatContext, base_url: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
        binary = self.executable("@openai", "codex-linux-x64", "vendor", "x86_64-unknown-linux-musl", "bin", "codex")
        home = f"{JAIL_WORK}/home/.codex"
        provider = {
            "name": "molt session",
            "base_url": base_url + "/v1",
            "env_key": "MOLT_API_KEY",
            "wire_api": "responses",
            "request_max_retries": 1,
            "stream_max_retries": 1,
        }
        config = [
            f"model = {json.dumps(ctx.model_name)}",
            'model_provider = "molt"',
            f"model_context_window = {ctx.max_length}",
            "project_doc_max_bytes = 0",
            "model_providers.molt = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in provider.items()) + "}",
            *CODEX_QUIET,
            *(CODEX_LEAN if self.lean else []),
        ]
        files = {}
        if self.instructions is not None:
            files["home/.codex/instructions.md"] = self.instructions
            config.append(f'model_instructions_file = "{home}/instructions.md"')
        files["home/.codex/config.toml"] = "\n".join(config) + "\n"
        argv = [binary, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--color"]
        argv += ["never", "--output-last-message", f"{JAIL_WORK}/logs/last_message.txt", ctx.prompt]
        env = {"CODEX_HOME": home, "MOLT_API_KEY": ctx.api_key, "NO_COLOR": "1", "RUST_LOG": "error"}
        return argv, env, files

    def final_text(self, run: HarnessRun) -> str:
        return run.stdout  # codex exec prints the final message last; the file copy is in logs/
