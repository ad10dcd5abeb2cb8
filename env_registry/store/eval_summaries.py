"""What an eval summary uploaded to a registry must hold: the ``summary.json`` of ``molt-env eval``.

A registry stores summaries per release (``POST /api/packages/<pkg>/<version>/evals``) and shows them on the env
card, so a number on the hub can be traced to the env ID, package version, spec hash, split, model and seed that
produced it. The keys below are required; ``pass@<k>`` keys (at least one, each a fraction, ``k <= n``) and any other
JSON fields are kept as uploaded. ``EvalSummaries`` holds the registry's calls on them (store, list, look up).

An eval's episodes (its ``samples.jsonl``, the lines of its env) may follow the summary
(``POST .../evals/<id>/samples``, by the summary's uploader): they are kept as files, ``<root>/evals/<id>/``
``samples.jsonl`` next to the stored ``summary.json``, the directory layout ``molt-env view`` reads, so the hub
serves them with the same viewer. Stored once; a second upload is a conflict.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy.engine import Engine

from env_registry.errors import Error
from env_registry.ids import parse_env_id
from env_registry.packages import names
from env_registry.store import database
from env_registry.store.database import evals
from env_registry.store.records import Conflict, EvalRecord, Forbidden, NotFound, ReleaseInfo

MAX_SUMMARY_BYTES = 256 << 10
PASS_AT_K = re.compile(r"pass@([1-9][0-9]{0,5})")
EVALS_DIR, SAMPLES, SUMMARY = "evals", "samples.jsonl", "summary.json"  # <root>/evals/<id>/, as `molt-env eval --out`


class InvalidSummary(Error, ValueError):
    """An uploaded eval summary misses a key, has a value of the wrong type, or is too large (HTTP 400/413)."""


class EvalSummary(BaseModel):
    """The required part of a ``summary.json``; extra keys are allowed and stored."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    env_id: str = Field(max_length=300)
    package_version: str = Field(max_length=100)
    spec_hash: str = Field(max_length=128)
    split: str = Field(max_length=100)
    num_prompts: int = Field(ge=0)
    n: int = Field(ge=1)
    mean_reward: float
    failures: dict[str, int]  # reason -> count
    model: str = Field(max_length=1000)
    seed: int | None
    started: str | float
    finished: str | float

    @field_validator("env_id")
    @classmethod
    def _valid_env_id(cls, value: str) -> str:
        if parse_env_id(value).pin is not None:
            raise ValueError("env_id names the env without a package pin; package_version says which package")
        return value

    @model_validator(mode="after")
    def _pass_at_k(self) -> EvalSummary:
        found = {key: value for key, value in (self.model_extra or {}).items() if key.startswith("pass@")}
        if not found:
            raise ValueError("a summary carries at least one pass@<k> key, e.g. 'pass@1': 0.25")
        for key, value in found.items():
            match = PASS_AT_K.fullmatch(key)
            if match is None or int(match[1]) > self.n:
                raise ValueError(f"key {key!r} must be pass@<k> with 1 <= k <= n ({self.n})")
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be a fraction in [0, 1], got {value!r:.40}")
        return self


def parse_summary(data: bytes | str | dict[str, Any], where: str = "the eval summary") -> dict[str, Any]:
    """Validate an eval summary; returns it as a JSON-ready dict (extra keys included).

    Args:
        data: the ``summary.json`` text, or its parsed dict.
        where: how error messages name it.

    Raises:
        InvalidSummary: not JSON, larger than ``MAX_SUMMARY_BYTES``, or a required key missing or wrong.
    """
    if not isinstance(data, dict):
        if len(data) > MAX_SUMMARY_BYTES:
            raise InvalidSummary(f"{where} is {len(data)} bytes; at most {MAX_SUMMARY_BYTES} are accepted")
        try:
            data = json.loads(data, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise InvalidSummary(f"{where} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidSummary(f"{where} must be a JSON object, got {type(data).__name__}")
    try:
        summary = EvalSummary.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"  {'.'.join(str(p) for p in err['loc']) or '(summary)'}: {err['msg']}"
            + (f" (got {err['input']!r:.80})" if err["loc"] else "")
            for err in exc.errors()
        ]
        raise InvalidSummary(f"{where} is not an eval summary of `molt-env eval`:\n" + "\n".join(problems)) from None
    encoded = summary.model_dump(mode="json")
    try:
        size = len(json.dumps(encoded, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidSummary(f"{where} holds a value JSON cannot carry: {exc}") from None
    if size > MAX_SUMMARY_BYTES:
        raise InvalidSummary(f"{where} is larger than {MAX_SUMMARY_BYTES} bytes as JSON")
    return encoded


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number; write null or a finite number")


class EvalSummaries:
    """The eval-summary calls of ``LocalRegistry`` (which supplies ``engine`` and ``release``)."""

    engine: Engine
    root: Path
    staging: Path
    release: Callable[[str, str], ReleaseInfo]

    def publish_eval(
        self, package: str, version: str, summary: dict[str, Any], publisher: str | None = None
    ) -> EvalRecord:
        """Store the eval summary (``summary.json`` of ``molt-env eval``) of one release.

        Args:
            package: the package name.
            version: the package version the summary evaluated.
            summary: the parsed ``summary.json``.
            publisher: the uploading token's publisher; None for local use.

        Returns:
            The summary as stored.

        Raises:
            InvalidSummary: the summary misses a required key or has a wrong value.
            NotFound: no such release.
            Conflict: the summary names another package version, or an env ID the release does not provide.
        """
        summary = parse_summary(summary)
        info = self.release(package, version)
        env_id, claimed = summary["env_id"], summary["package_version"]
        if names.package_version(claimed) != info.version:
            raise Conflict(
                f"the summary evaluated {info.package} {claimed}, not {info.version}; upload it to that version"
            )
        if env_id not in info.env_ids:
            raise Conflict(
                f"{info.package} {info.version} provides {info.env_ids}, not {env_id!r}; upload the summary to "
                "the release that provides the env it evaluated"
            )
        now = time.time()
        with database.write(self.engine, exclusive=False) as db:
            result = db.execute(
                evals.insert().values(
                    package=info.package,
                    version=info.version,
                    env_id=env_id,
                    publisher=publisher,
                    uploaded=now,
                    summary=json.dumps(summary, sort_keys=True),
                )
            )
        return EvalRecord(
            id=result.inserted_primary_key[0],
            package=info.package,
            version=info.version,
            env_id=env_id,
            publisher=publisher,
            uploaded=now,
            summary=summary,
        )

    def evals(self, package: str, version: str) -> list[EvalRecord]:
        """The eval summaries stored for one release, oldest first.

        Raises:
            NotFound: no such release.
        """
        info = self.release(package, version)
        with database.read(self.engine) as db:
            rows = db.execute(
                sa.select(evals)
                .where(evals.c.package == info.package, evals.c.version == info.version)
                .order_by(evals.c.id)
            ).all()
        return [self._record(r) for r in rows]

    def eval_record(self, eval_id: int) -> EvalRecord:
        """One stored eval summary by its id.

        Raises:
            NotFound: no eval has that id.
        """
        row = None
        if 0 <= eval_id < 1 << 63:  # a database integer
            with database.read(self.engine) as db:
                row = db.execute(sa.select(evals).where(evals.c.id == eval_id)).first()
        if row is None:
            raise NotFound(f"this registry has no eval {eval_id} (eval ids are on the env pages and in .../evals)")
        return self._record(row)

    def eval_dir(self, eval_id: int) -> Path:
        """Where an eval's episodes are kept (``samples.jsonl`` and ``summary.json``; it may not exist)."""
        return self.root / EVALS_DIR / str(int(eval_id))

    def publish_eval_samples(
        self, package: str, version: str, eval_id: int, samples: Path, publisher: str | None = None
    ) -> EvalRecord:
        """Keep the episodes of a stored eval: a copy of ``samples`` (its ``samples.jsonl``, the lines of the eval's
        env) in ``eval_dir(eval_id)`` with the stored summary as ``summary.json``.

        Args:
            package: the package name of the eval's release.
            version: its version.
            eval_id: the stored summary's id (``publish_eval``'s answer).
            samples: the file to copy.
            publisher: the uploading token's publisher (it must be the summary's uploader); None for local use.

        Returns:
            The eval's record, ``samples`` now True.

        Raises:
            NotFound: no such release, or no eval ``eval_id`` of it.
            Forbidden: another publisher uploaded the summary.
            Conflict: the eval's episodes are stored already.
        """
        info = self.release(package, version)
        record = self.eval_record(eval_id)
        if (record.package, record.version) != (info.package, info.version):
            raise NotFound(f"eval {eval_id} is of {record.package} {record.version}, not {info.package} {info.version}")
        if publisher is not None and record.publisher is not None and publisher != record.publisher:
            raise Forbidden(f"eval {eval_id} was uploaded by {record.publisher!r}: only they may add its episodes")
        target = self.eval_dir(eval_id)
        target.parent.mkdir(exist_ok=True)
        staged = self.staging / f"eval-{eval_id}-{uuid.uuid4().hex}"
        staged.mkdir()
        try:
            shutil.copyfile(samples, staged / SAMPLES)
            (staged / SUMMARY).write_text(json.dumps(record.summary, sort_keys=True))
            try:
                os.rename(staged, target)  # atomic: a concurrent upload of the same eval finds it there
            except OSError:
                raise Conflict(f"the episodes of eval {eval_id} are stored already; they are immutable") from None
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        with database.write(self.engine, exclusive=False) as db:  # the content stamp: pages that link them change
            db.execute(evals.update().where(evals.c.id == eval_id).values(uploaded=evals.c.uploaded))
        return record.model_copy(update={"samples": True})

    def _record(self, row: Any) -> EvalRecord:
        stored = (self.eval_dir(row.id) / SAMPLES).is_file()
        return EvalRecord(**{**row._asdict(), "summary": json.loads(row.summary)}, samples=stored)
