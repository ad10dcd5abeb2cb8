"""An env's versions side by side, and what changed between two of them, from what the registry stored: the
manifests, the publish gate's verdicts and its reference evals (``env_registry.validation.calibration``). The hub
runs no package code for any of it.

- ``version_rows``: per package version providing the env, its spec hash (the calibration's, else computed from the
  stored manifest as ``EnvSpec.hash`` does), validation verdict and reference score (mean reward, pass@1), and the
  older version it can be compared with (the previous one that has a reference eval too).
- ``calibration_diff``: two versions' reference evals prompt by prompt (by prompt ID): each prompt's mean reward
  and passes in each, and by how much the reward moved.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from env_registry.errors import Error
from env_registry.manifest import EnvSpec
from env_registry.packages import names
from env_registry.store.local import LocalRegistry, NotFound, ReleaseInfo

CHANGED = 1e-9  # a prompt whose mean reward moved by more than this changed


class BadRange(Error, ValueError):
    """A version range that is not ``V1..V2`` (HTTP 400)."""


def calibration_of(report: dict[str, Any] | None, env_id: str) -> dict[str, Any] | None:
    """The env's reference-eval figures in a validation report (None without one, or when it did not finish)."""
    figures = ((report or {}).get("calibration") or {}).get(env_id)
    return figures if isinstance(figures, dict) and not figures.get("error") else None


def spec_hash(release: ReleaseInfo, manifest: dict[str, Any]) -> str | None:
    """The env's spec hash as an install of ``release`` registers it (None if the stored manifest does not load)."""
    try:
        spec = EnvSpec.model_validate({**manifest, "package": release.package, "package_version": release.version})
    except ValidationError:
        return None
    return spec.hash


def version_rows(registry: LocalRegistry, releases: list[ReleaseInfo], env_id: str) -> list[dict[str, Any]]:
    """The version table of an env card, newest first (one validation read per version)."""
    rows = []
    for release in releases:
        status, report = registry.validation(release.package, release.version)
        figures = calibration_of(report, env_id)
        manifest = next((m for m in release.manifests if m.get("id") == env_id), {})
        passk = (figures or {}).get("pass_at_k") or [None]
        rows.append(
            {
                "release": release,
                "spec_hash": (figures or {}).get("spec_hash") or spec_hash(release, manifest),
                "validation": status,
                "calibrated": figures is not None,
                "mean_reward": (figures or {}).get("mean_reward"),
                "pass1": passk[0],
                "compare": None,
            }
        )
    calibrated = [r for r in rows if r["calibrated"]]
    for newer, older in zip(calibrated[1:], calibrated, strict=False):
        newer["compare"] = older["release"].version
    return rows[::-1]


def parse_range(text: str) -> tuple[str, str]:
    """``"1.0.0..1.1.0"`` -> the two versions, normalized.

    Raises:
        BadRange: not two versions joined by ``..``.
    """
    old, sep, new = text.partition("..")
    if not sep or not old or not new:
        raise BadRange(f"{text[:100]!r} is not a version range: write OLD..NEW, e.g. 1.0.0..1.1.0")
    try:
        return names.package_version(old), names.package_version(new)
    except Error as exc:
        raise BadRange(f"{text[:100]!r} is not a version range: {exc}") from None


def figures_of(registry: LocalRegistry, releases: list[ReleaseInfo], env_id: str, version: str) -> dict[str, Any]:
    """The reference eval of ``env_id`` in ``version``, one of ``releases``.

    Raises:
        NotFound: no such version provides the env, or it has no reference eval.
    """
    release = next((r for r in releases if r.version == version), None)
    if release is None:
        raise NotFound(f"{env_id} has no version {version!r}; versions: {[r.version for r in releases]}")
    figures = calibration_of(registry.validation(release.package, release.version)[1], env_id)
    if figures is None:
        raise NotFound(f"{env_id} {version} has no reference eval (the publish gate's calibration) to compare")
    return figures


def _per_prompt(figures: dict[str, Any]) -> dict[int, tuple[float | None, int | None]]:
    """Prompt ID -> (mean reward, passes); a calibration stored before per-prompt rewards gives its pass rate."""
    passes = figures.get("passes_per_prompt") or []
    ids = figures.get("prompt_ids") or list(range(len(passes)))
    rewards = figures.get("reward_per_prompt") or [p / figures["n"] if figures.get("n") else None for p in passes]
    return {
        pid: (rewards[i] if i < len(rewards) else None, passes[i] if i < len(passes) else None)
        for i, pid in enumerate(ids)
    }


def calibration_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Two reference evals compared prompt by prompt.

    Returns:
        ``rows`` (every prompt of either: ``prompt``, ``old``/``new`` mean reward, ``old_passes``/``new_passes``,
        ``delta`` or None where a side lacks it, ``changed``), ``changed`` (how many moved), ``mean_delta`` and
        ``pass1_delta`` (None where a side lacks it), and ``caveats`` (a different policy, split or n: part of the
        difference may be theirs).
    """
    before, after = _per_prompt(old), _per_prompt(new)
    rows = []
    for pid in sorted(before.keys() | after.keys()):
        (r0, p0), (r1, p1) = before.get(pid, (None, None)), after.get(pid, (None, None))
        delta = r1 - r0 if isinstance(r0, int | float) and isinstance(r1, int | float) else None
        changed = delta is None or abs(delta) > CHANGED or p0 != p1
        rows.append(
            {
                "prompt": pid,
                "old": r0,
                "new": r1,
                "old_passes": p0,
                "new_passes": p1,
                "delta": delta,
                "changed": changed,
            }
        )
    caveats = [
        f"{what} differs: {old.get(key)} before, {new.get(key)} after"
        for key, what in (("policy", "the reference policy"), ("split", "the split"), ("n", "n (samples per prompt)"))
        if old.get(key) != new.get(key)
    ]

    def delta(key: str, i: int | None = None) -> float | None:
        a, b = old.get(key), new.get(key)
        if i is not None:
            a, b = (a or [None])[i], (b or [None])[i]
        return b - a if isinstance(a, int | float) and isinstance(b, int | float) else None

    return {
        "rows": rows,
        "changed": sum(r["changed"] for r in rows),
        "mean_delta": delta("mean_reward"),
        "pass1_delta": delta("pass_at_k", 0),
        "old_mean": old.get("mean_reward"),
        "new_mean": new.get("mean_reward"),
        "n_old": old.get("n"),
        "n_new": new.get("n"),
        "caveats": caveats,
    }
