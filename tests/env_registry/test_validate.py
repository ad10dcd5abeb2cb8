"""``molt-env validate``: a fresh venv with real pip, the checks inside the sandbox jail, hostile packages contained."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from eval_support import molt_env  # noqa: E402

from env_registry.validation import ValidationReport, validate  # noqa: E402
from env_registry.validation.checks import run_checks  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "envs" / "acme_letter_count"


def failed(report: ValidationReport) -> dict[str, str]:
    return {c.name: c.detail for c in report.checks if not c.passed}


def test_the_example_package_is_sound(tmp_path):
    """Published to a registry directory, then validated by its env ID (downloaded, sha256 checked)."""
    registry = str(tmp_path / "registry")
    published = molt_env("publish", str(EXAMPLE), "--registry", registry)
    assert published.returncode == 0, published.stderr
    done = molt_env("validate", "acme/letter-count-v1@1.0.0", "--registry", registry, "--json", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    report = ValidationReport.from_json(json.loads(done.stdout))
    assert report.ok and report.package == "acme-letter-count" and report.env_ids == ["acme/letter-count-v1"]
    assert "jail" in report.isolation and "no network" in report.isolation
    names = {c.name for c in report.checks}
    for name in ("download", "install into a fresh venv", "import through the entry point", "train and test share no prompt",
                 "determinism: same grade for the same transcript", "smoke eval: over-long answer",
                 "smoke eval: reference answer", "conformance: row 0: reference action"):  # fmt: skip
        assert name in names, name
    install = next(c for c in report.checks if c.name == "install into a fresh venv")
    assert "torch" not in install.detail and "acme_letter_count" in install.detail  # declared dependencies only


def test_a_chat_agent_package_is_checked_through_the_session_server(tmp_path):
    src = tmp_path / "chat"
    made = molt_env("init", str(src), "--id", "acme/chat-echo-v1", "--kind", "chat_agent")
    assert made.returncode == 0, made.stderr
    report = validate(src)
    assert report.ok, report.render()
    assert any(c.name.startswith("conformance: row 0: reference completion (through the session server)")
               for c in report.checks)  # fmt: skip


HOSTILE = """
import os, pathlib, time

from molt_envs import Env, Result

OUTCOMES = []
for target in ({host!r}, pathlib.Path(__file__).with_name("planted.py")):
    try:
        pathlib.Path(target).write_text("pwned")
        OUTCOMES.append(f"wrote {{target}}")
    except OSError as exc:
        OUTCOMES.append(f"{{target}}: {{exc}}")
print("HOSTILE", OUTCOMES, flush=True)
children = 0
for _ in range(500):
    try:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "4242.4242"])
        children += 1
    except OSError:
        break
print("HOSTILE forked", children, flush=True)
time.sleep(10**6)


class Hostile(Env):
    async def step(self, state):
        return Result(reward=1.0)
"""


def test_a_hostile_package_stays_in_the_jail(tmp_path):
    """Its import writes outside its directory, forks without end and then hangs: validation stays contained."""
    src = tmp_path / "hostile"
    made = molt_env("init", str(src), "--id", "evil/hostile-v1")
    assert made.returncode == 0, made.stderr
    host_file = tmp_path / "pwned-on-the-host"
    module = next(src.glob("*/env.py"))
    entry = module.parent.name
    module.write_text(HOSTILE.format(host=str(host_file)))
    pyproject = src / "pyproject.toml"
    text = pyproject.read_text()
    old_entry = next(line.split('"')[-2] for line in text.splitlines() if line.startswith('"evil/hostile-v1"'))
    pyproject.write_text(text.replace(old_entry, f"{entry}.env:Hostile"))
    report = validate(src, timeout_s=20)
    problems = failed(report)
    assert not report.ok and set(problems) == {"checks ran to the end"}, report.render()
    assert "did not finish within 20 s" in problems["checks ran to the end"]
    assert "importing" in problems["checks ran to the end"]  # the step it hung in
    assert not host_file.exists()
    stray = subprocess.run(["pgrep", "-f", "sleep 4242.4242"], capture_output=True, text=True)
    assert stray.stdout.strip() == "", "a forked child outlived the jail"


def test_the_checks_name_what_is_broken():
    import broken_envs  # noqa: F401  (registers broken/*)

    checks = []
    ids = ["broken/out-of-range-v1", "broken/crash-v1", "broken/moody-v1", "broken/short-v1"]
    run_checks(ids, None, checks.append, lambda s: None)
    bad = {(c.env_id, c.name): c.detail for c in checks if not c.passed}
    assert (
        "outside the declared reward_range [0.0, 1.0]"
        in bad[("broken/out-of-range-v1", "smoke eval: reference answer")]
    )
    assert "ValueError" in bad[("broken/crash-v1", "smoke eval: empty answer")]
    assert ("broken/crash-v1", "smoke eval: reference answer") not in bad
    assert "4 of 4 test prompts also appear in train" in bad[("broken/moody-v1", "train and test share no prompt")]
    assert ("broken/moody-v1", "determinism: same grade for the same transcript") in bad
    assert "earned" in bad[("broken/moody-v1", "smoke eval: reference answer")]
    assert (
        "3 rows; the manifest's kwargs say size = 4"
        in bad[("broken/short-v1", "dataset split 'test' has the declared size")]
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [("does/not-exist.whl", "does not exist"), (".", "pyproject.toml"), ("acme/nothing-v1", "provides env ID")],
)
def test_a_target_that_is_not_a_package_is_a_failed_report(tmp_path, target, message):
    if target == ".":
        target = str(tmp_path)
    report = validate(target, registry=str(tmp_path / "registry"))
    assert not report.ok and message in " ".join(failed(report).values()), report.render()


def test_sample_prompts_from_the_jail_are_bounded_and_reduced_to_text():
    """What a package's jailed checks send as sample prompts is kept only as strings and chat messages of text,
    at most 3 per split and 2,000 characters each, for env IDs under validation; anything else is dropped."""
    report = ValidationReport(target="t", env_ids=["a/b-v1"])
    hostile = [
        [{"role": "user", "content": "<script>alert(1)</script>" + "x" * 5000, "extra": {"__class__": 1}}],
        "plain text",
        [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": "data:"}]}],
        [{"role": "user", "content": "a fourth prompt is dropped"}],
    ]
    report.add_samples("a/b-v1", "test", hostile)
    report.add_samples("a/b-v1", "train", [{"not": "a prompt"}, 42, [["nested"]]])
    report.add_samples("other/env-v1", "test", ["not under validation"])
    report.add_samples("a/b-v1", "x" * 100, ["an absurd split name"])
    report.add_samples("a/b-v1", "odd", "not a list")
    kept = report.to_json()["samples"]
    assert list(kept) == ["a/b-v1"] and set(kept["a/b-v1"]) == {"test", "train"}
    first, text, parts = kept["a/b-v1"]["test"]
    assert first == [{"role": "user", "content": ("<script>alert(1)</script>" + "x" * 5000)[:2000]}]
    assert text == "plain text" and parts == [{"role": "user", "content": "look [image]"}]
    assert kept["a/b-v1"]["train"] == []
    assert ValidationReport.from_json(report.to_json()).samples == kept
