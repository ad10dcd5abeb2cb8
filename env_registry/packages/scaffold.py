"""``molt-env init``: a new env package that checks, builds, publishes and installs as it stands.

The package is a plain hatchling project that states each fact once: the ``molt.envs`` entry point (the manifest
takes its ID and entry point from it), a ``[tool.molt.env]`` manifest with the fields an author edits first (kind,
description, tags, license, reward range, turns) and one set of row keys and prompt for both splits, the ``molt``
build hook (which validates the manifest and ships the pyproject in the wheel's ``.dist-info``, so registries read
manifests without importing anything), an env module, a small JSONL dataset, a one-line conformance test and a
README.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from env_registry.errors import Error
from env_registry.ids import parse_env_id
from env_registry.packages import names

SAMPLE_TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "42 is the answer",
    "molt environments",
    "Repeat after me: exactly this.",
    "tabs\tand  double  spaces",
    "ünïcödé is fine",
    "a, b, c; 1, 2, 3",
    "short",
    "One more line of text to echo back.",
    "UPPER and lower",
    "ends with a period.",
]

ENV_MODULE = '''"""``{env_id}``: the model must repeat the text it was given, exactly."""

from __future__ import annotations

import re

from molt_envs.contract import Env, Result, StepState

_SPECIAL_TOKENS = re.compile(r"<\\|[^|>]*\\|>")  # e.g. a trailing <|im_end|>


class {cls}(Env):
    async def step(self, state: StepState) -> Result:
        answer = _SPECIAL_TOKENS.sub("", state["action_text"]).strip()
        exact = answer == str(state["label"]).strip()
        return Result(reward=1.0 if exact else 0.0, terminated=True, info={{"exact": exact}})
'''

AGENT_MODULE = '''"""``{env_id}``: an agent that asks the policy (through the OpenAI SDK) to repeat a text, exactly."""

from __future__ import annotations

from molt_envs.contract import ChatAgent, ChatContext, Result


class {cls}(ChatAgent):
    async def run(self, ctx: ChatContext) -> Result:
        from openai import AsyncOpenAI  # the policy, served by the trainer behind an OpenAI-compatible endpoint

        client = AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key)
        reply = await client.chat.completions.create(
            model=ctx.model_name, messages=ctx.messages, max_tokens=ctx.sampling_params.max_tokens,
            temperature=ctx.sampling_params.temperature)
        answer = (reply.choices[0].message.content or "").strip()
        exact = answer == str(ctx.label).strip()
        return Result(reward=1.0 if exact else 0.0, terminated=True, info={{"exact": exact}})
'''

PYPROJECT = """[build-system]
requires = ["hatchling>=1.25", "molt-ecosystem>=0.1"]
build-backend = "hatchling.build"

[project]
name = "{package}"
version = "0.1.0"
description = "{description}"
readme = "README.md"
requires-python = ">=3.11"
dependencies = [{dependencies}]

[project.entry-points."molt.envs"]
"{env_id}" = "{entry_point}"

[tool.hatch.build.hooks.molt]  # validates the manifest below and ships it in the wheel's metadata

[tool.molt.env]  # its ID and entry point are the entry point's; the keys and prompt below hold for every split
kind = "{kind}"
description = "{description}"
tags = ["echo", "single-turn", "text"]
license = "Apache-2.0"
reward_range = [0.0, 1.0]
max_turns = 1
input_key = "text"
label_key = "text"
reference_key = "text"
prompt_template = "Repeat the following text exactly and write nothing else:\\n{{input}}"
datasets.train.path = "data/train.jsonl"
datasets.test.path = "data/test.jsonl"
"""

TEST_MODULE = '''"""``{env_id}`` as installed (`pip install -e .`, then `pytest`)."""

from env_registry import check_env


def test_conformance():
    check_env("{env_id}").assert_passed()
{extra_test}'''

ENV_EXTRA_TEST = """

def test_reward_is_exact_match():
    import asyncio

    from {module}.{module_file} import {cls}

    def reward(action: str) -> float:
        return asyncio.run({cls}().step({{"action_text": action, "label": "hello world"}})).reward

    assert reward("hello world<|im_end|>") == 1.0
    assert reward("Hello world") == 0.0
"""

README = """# {package}

`{env_id}`: {description}

```bash
molt-env check .                                   # conformance on this source tree
pip install -e . && pytest                         # the package's own tests, on it as installed
molt-env build .                                   # wheel + sdist + content hash into dist/
molt-env publish . --registry ~/.molt/registry     # or --registry http://host:8080 --token $MOLT_TOKEN
molt-env install {env_id} --registry ~/.molt/registry
python -c "import env_registry; print(env_registry.make('{env_id}'))"
```

Bump `version` in `pyproject.toml` before each publish: published versions are immutable. Change the `-vN` of the
env ID when the reward, observations or tools change meaning.
"""


def init(directory: str | Path, env_id: str, kind: str = "env", package: str | None = None) -> Path:
    """Write a new env package into ``directory`` (which must not exist or be empty); returns its path."""
    parsed = parse_env_id(env_id)
    if parsed.pin is not None or parsed.version is None:
        raise Error(f"give a versioned env ID without a package pin, e.g. 'acme/echo-v1', not {env_id!r}")
    if kind not in ("env", "chat_agent"):
        raise Error(f"kind {kind!r} is not 'env' or 'chat_agent'")
    package = names.package_name(package or "-".join(filter(None, [parsed.namespace, parsed.name])))
    module = re.sub(r"\W", "_", package)
    cls = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", parsed.name) if part)
    cls = (cls if cls[:1].isalpha() else f"X{cls}") + ("Env" if kind == "env" else "Agent")
    module_file = "env" if kind == "env" else "agent"
    root = Path(directory)
    if root.exists() and any(root.iterdir()):
        raise Error(f"{root} already exists and is not empty; pick a new directory")
    description = f"Repeat the given text exactly ({kind} template from molt-env init)"
    dependencies = '"molt-ecosystem>=0.1"' + (', "openai>=1.40"' if kind == "chat_agent" else "")
    fields = dict(
        env_id=parsed.unpinned,
        package=package,
        module=module,
        module_file=module_file,
        cls=cls,
        kind=kind,
        description=description,
        dependencies=dependencies,
        entry_point=f"{module}.{module_file}:{cls}",
    )
    files = {
        "pyproject.toml": PYPROJECT.format(**fields),
        f"{module}/__init__.py": f'"""The ``{parsed.unpinned}`` environment package."""\n',
        f"{module}/{module_file}.py": (ENV_MODULE if kind == "env" else AGENT_MODULE).format(**fields),
        f"{module}/data/train.jsonl": _jsonl(SAMPLE_TEXTS[:8]),
        f"{module}/data/test.jsonl": _jsonl(SAMPLE_TEXTS[8:]),
        "tests/test_env.py": TEST_MODULE.format(
            **fields, extra_test=ENV_EXTRA_TEST.format(**fields) if kind == "env" else ""
        ),
        "README.md": README.format(**fields),
        ".gitignore": "__pycache__/\n*.pyc\ndist/\nbuild/\n.pytest_cache/\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _jsonl(texts: list[str]) -> str:
    return "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
