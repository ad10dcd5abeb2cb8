"""The ``[tool.molt.env]`` manifest of an env package and the ``EnvSpec`` built from it.

A package's ``pyproject.toml`` holds one ``[tool.molt.env]`` table, or an array ``[[tool.molt.env]]`` for several
env IDs. The wheel carries that file in its ``.dist-info`` (the ``molt`` hatchling build hook, or hatchling's
``extra-metadata``), so the registry reads manifests from installed metadata without importing any env module. A
package with many IDs may keep them in a catalog file instead (``[[env]]`` tables, the same fields), shipped the same
way as ``molt/catalog.toml``.

A table states each fact once: ``entry_point`` may be left out (the package's ``molt.envs`` entry point for the ID
says it), so may ``id`` when the package has one manifest and one such entry point, and the row keys and prompt of
every split (``SPLIT_DEFAULTS``) may be given once at the top of the table, each split overriding what it sets.
``parse_manifests`` fills those in, so an ``EnvManifest`` (and the spec and hash made from it) is the same whichever
way the table was written.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from env_registry.errors import ManifestError
from env_registry.ids import SCHEME_ID, parse_env_id

_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_SAFE_PATH = re.compile(r"^[\w][\w./-]*$")
ENTRY_POINT_GROUP = "molt.envs"
SPLIT_DEFAULTS = ("input_key", "label_key", "reference_key", "prompt_template", "system_prompt")


class DatasetSplit(BaseModel):
    """One split: a JSONL file inside the package, or a generator function ``pkg.mod:fn(split=..., **kwargs)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = None  # relative to the env module's package directory
    generator: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    input_key: str = "prompt"
    label_key: str = "label"
    reference_key: str | None = None  # a completion that earns the top reward (SFT data, conformance checks)
    image_key: str | None = None  # the row field holding its image(s) for a vision env (one image or a list)
    prompt_template: str | None = None  # e.g. "{input}\nPut the final answer in \\boxed{{}}."
    system_prompt: str | None = None
    env_kwargs: bool = False  # the generator also gets the env's kwargs (difficulty knobs), so data follows make()

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSplit:
        if (self.path is None) == (self.generator is None):
            raise ValueError("give exactly one of 'path' (a JSONL file in the package) or 'generator' ('pkg.mod:fn')")
        if self.path is not None and (not _SAFE_PATH.match(self.path) or ".." in self.path.split("/")):
            raise ValueError(f"path {self.path!r} must be relative to the package, without '..'")
        if self.generator is not None and not _ENTRY_POINT.match(self.generator):
            raise ValueError(f"generator {self.generator!r} must look like 'package.module:function'")
        if self.env_kwargs and self.generator is None:
            raise ValueError("env_kwargs = true needs a 'generator' (a JSONL file cannot follow the env's kwargs)")
        return self


class DatasetCard(BaseModel):
    """Where an env's data comes from. Generator, seeds and split sizes are the split tables' own fields
    (``generator``, ``kwargs``); ``molt-env info`` shows them next to this card, so each fact is stated once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str  # e.g. "reasoning-gym 0.1.25 (PyPI), procedurally generated"
    license: str  # the data's license (SPDX), which may differ from the code's
    held_out: str  # how the test split is kept apart from the train split
    citation: str | None = None


class ToolNeed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sandbox: Literal["none", "auto", "local", "docker", "ray"] = "auto"
    description: str = ""


class EnvManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    entry_point: str
    kind: Literal["env", "chat_agent", "game"] = "env"  # game: several seats per episode (molt_envs.seats)
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    license: str | None = None
    reward_range: tuple[float, float] = (0.0, 1.0)
    modality: Literal["text", "vision"] = "text"
    tools: list[ToolNeed] = Field(default_factory=list)
    datasets: dict[str, DatasetSplit] = Field(default_factory=dict)
    card: DatasetCard | None = None
    max_turns: int | None = Field(default=None, ge=1)
    deterministic: bool = True
    lifecycle: Literal["active", "deprecated"] = "active"
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        env_id = parse_env_id(value)
        if env_id.pin is not None:
            raise ValueError(f"a manifest id cannot carry a package pin ('@{env_id.pin}'); the package version pins it")
        return value

    @field_validator("entry_point")
    @classmethod
    def _valid_entry_point(cls, value: str) -> str:
        if not _ENTRY_POINT.match(value):
            raise ValueError(f"entry_point {value!r} must look like 'package.module:ClassName'")
        return value

    @field_validator("reward_range")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        lo, hi = value
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"reward_range must be two finite numbers [low, high] with low <= high, got {list(value)}")
        return value

    @field_validator("datasets")
    @classmethod
    def _split_names(cls, value: dict[str, DatasetSplit]) -> dict[str, DatasetSplit]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"dataset split name {name!r} may only use letters, digits, '_' and '-'")
        return value


class EnvSpec(EnvManifest):
    """A registered env: its manifest plus the package that provides it. JSON data only.

    An env of another ecosystem has a ``SCHEME:NAME`` ID (made by that scheme's source) and ``upstream``: the library
    it adapts, that library's version and, where the source gives one, its license. Both are hashed.
    """

    package: str | None = None
    package_version: str | None = None
    upstream: dict[str, str] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        if SCHEME_ID.fullmatch(value):
            return value  # "rg:countdown": its source checked the name
        return EnvManifest._valid_id(value)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> EnvSpec:
        return cls.model_validate_json(text)

    @property
    def hash(self) -> str:
        """Stable across processes and machines: sha256 of the canonical JSON (includes the package version)."""
        data = self.model_dump(mode="json")
        if not data["upstream"]:  # a native env's hash is what it was before foreign envs had this field
            del data["upstream"]
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def parse_manifests(table: Any, source: str, entry_points: Mapping[str, str] | None = None) -> list[EnvManifest]:
    """Validate the value of ``tool.molt.env`` (a table or an array of tables), filling in what it leaves out.

    Args:
        table: the parsed TOML value. source: names it in errors.
        entry_points: the package's ``molt.envs`` entry points (ID -> ``"pkg.mod:Class"``), or None when unknown;
            a manifest without ``entry_point`` (or ``id``) takes it from them.

    Returns:
        One manifest per table.

    Raises:
        ManifestError: naming the table, the field and the offending value.
    """
    tables = table if isinstance(table, list) else [table]
    manifests = []
    for i, entry in enumerate(tables):
        where = source if len(tables) == 1 else f"{source}[{i}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: [tool.molt.env] must be a table, got {type(entry).__name__} {entry!r:.80}")
        entry = _filled_in(entry, where, entry_points or {}, len(tables))
        try:
            manifests.append(EnvManifest.model_validate(entry))
        except ValidationError as exc:
            raise ManifestError(format_validation_error(exc, where, entry)) from None
    ids = [m.id for m in manifests]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ManifestError(f"{source}: env id(s) {duplicates} declared more than once")
    return manifests


def _filled_in(entry: dict[str, Any], where: str, entry_points: Mapping[str, str], tables: int) -> dict[str, Any]:
    """The table with ``id`` and ``entry_point`` taken from the entry points and the split defaults moved into
    every split (a split's own value wins)."""
    entry = dict(entry)
    if "id" not in entry and tables == 1 and len(entry_points) == 1:
        entry["id"] = next(iter(entry_points))
    if "entry_point" not in entry and isinstance(entry.get("id"), str) and entry["id"] in entry_points:
        entry["entry_point"] = entry_points[entry["id"]]
    shared = {key: entry.pop(key) for key in SPLIT_DEFAULTS if key in entry}
    if not shared:
        return entry
    datasets = entry.get("datasets")
    if not isinstance(datasets, dict) or not datasets:
        raise ManifestError(
            f"{where}: {sorted(shared)} are defaults for the dataset splits, but the table declares none; "
            'add the splits (e.g. datasets.train.path = "data/train.jsonl") or remove them'
        )
    entry["datasets"] = {
        name: {**shared, **split} if isinstance(split, dict) else split for name, split in datasets.items()
    }
    return entry


def format_validation_error(exc: ValidationError, where: str, entry: Mapping[str, Any] | None = None) -> str:
    """One line per invalid field of a manifest table: the field, what is wrong, and the value or what to add."""
    env_id = (entry or {}).get("id", "ns/name-v1")
    missing = {
        "id": f"give the env ID (it may be left out only with one manifest and one {ENTRY_POINT_GROUP!r} entry point)",
        "entry_point": f'add "{env_id}" = "package.module:Class" to [project.entry-points."{ENTRY_POINT_GROUP}"]',
    }
    lines = [f"invalid manifest in {where}:"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(table)"
        if err["type"] == "missing" and field in missing:
            lines.append(f"  field {field!r}: {err['msg']}; {missing[field]}")
        else:
            lines.append(f"  field {field!r}: {err['msg']} (got {err.get('input')!r:.100})")
    return "\n".join(lines)


def manifests_from_pyproject(text: str, source: str) -> list[EnvManifest]:
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise ManifestError(f"{source}: not valid TOML: {exc}") from None
    return pyproject_manifests(data, source)


def pyproject_manifests(data: Mapping[str, Any], source: str) -> list[EnvManifest]:
    """The manifests of a parsed ``pyproject.toml``, completed from its ``molt.envs`` entry points.

    Raises:
        ManifestError: for a missing ``[tool.molt.env]`` table or an invalid manifest.
    """
    table = data.get("tool", {}).get("molt", {}).get("env")
    if table is None:
        raise ManifestError(
            f"{source}: no [tool.molt.env] table; add one (with at least the env's dataset splits; "
            "`molt-env init` writes an example)"
        )
    entry_points = data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return parse_manifests(table, f"{source} [tool.molt.env]", entry_points if isinstance(entry_points, dict) else {})


def manifests_from_catalog(text: str, source: str, entry_points: Mapping[str, str] | None = None) -> list[EnvManifest]:
    """The ``[[env]]`` tables of a catalog file (a package's manifests kept out of its ``pyproject.toml``);
    ``entry_points`` (the package's ``molt.envs`` group) complete them as ``parse_manifests`` says."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ManifestError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"env"})
    if unknown or not isinstance(data.get("env"), list):
        raise ManifestError(f"{source}: a catalog holds only [[env]] tables, got keys {sorted(data)}")
    return parse_manifests(data["env"], f"{source} [[env]]", entry_points)


def read_pyproject_manifests(path: str | Path) -> list[EnvManifest]:
    path = Path(path)
    return manifests_from_pyproject(path.read_text(), str(path))


def manifest_json_schema() -> dict[str, Any]:
    return EnvManifest.model_json_schema()
