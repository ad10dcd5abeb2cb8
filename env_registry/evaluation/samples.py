"""An eval directory: ``eval.json`` (what the eval is) and ``samples.jsonl`` (one line per finished sample).

Each sample is appended and ``fsync``-ed the moment it completes, so a killed eval loses nothing; a line torn by the
kill is cut off when the directory is opened again. Re-running into the same directory skips every sample already
there, after checking that the model, split, sampling and env versions match what produced them.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from env_registry.errors import Error

SAMPLES = "samples.jsonl"
HEADER = "eval.json"

Key = tuple[str, int, int]  # (env_id, prompt_id, sample)


def key_of(record: dict[str, Any]) -> Key:
    return record["env_id"], int(record["prompt_id"]), int(record["sample"])


class SampleStore:
    """Samples of one eval, in memory and (with ``root``) on disk. Appends are serialized off the event loop."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else None
        self.records: dict[Key, dict[str, Any]] = {}
        self.header: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._file = None
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            header = self.root / HEADER
            if header.is_file():
                try:
                    self.header = json.loads(header.read_text())
                except ValueError as exc:
                    raise Error(f"{header} is not valid JSON ({exc}); move it away or use another --out") from None
            self._load(self.root / SAMPLES)

    def _load(self, path: Path) -> None:
        if not path.is_file():
            return
        data = path.read_bytes()
        good = 0  # byte offset after the last complete line
        for number, line in enumerate(data.split(b"\n"), 1):
            end = good + len(line) + 1
            if end > len(data):  # the last piece has no newline: torn by a kill, or empty
                break
            if line.strip():
                try:
                    record = json.loads(line)
                    self.records[key_of(record)] = record
                except (ValueError, KeyError, TypeError) as exc:
                    raise Error(
                        f"{path}:{number} is not a sample record ({exc}); the file was edited or corrupted. "
                        "Fix or delete that line, or use another --out"
                    ) from None
            good = end
        if good < len(data):
            with path.open("r+b") as f:  # drop the torn tail so appends start on a fresh line
                f.truncate(good)

    def begin(self, header: dict[str, Any], must_match: Iterable[str]) -> None:
        """Write ``eval.json``, or check a resumed eval's header against it on the keys ``must_match``.

        Raises:
            Error: the directory holds samples of a different eval, naming the first field that differs.
        """
        if self.header is not None:
            for name in must_match:
                if self.header.get(name) != header.get(name):
                    raise Error(
                        f"{self.root} holds an eval with {name} = {json.dumps(self.header.get(name))}, not "
                        f"{json.dumps(header.get(name))}; resume it with the same flags, or use another --out"
                    )
            header = {**header, "started": self.header.get("started", header.get("started"))}
        self.header = header
        if self.root is not None:
            tmp = self.root / (HEADER + ".tmp")
            tmp.write_text(json.dumps(header, indent=2) + "\n")
            os.replace(tmp, self.root / HEADER)

    def has(self, key: Key) -> bool:
        return key in self.records

    async def add(self, record: dict[str, Any]) -> None:
        """Keep ``record`` and, on disk, append it durably (written and fsync-ed before this returns)."""
        line = json.dumps(record, ensure_ascii=False, default=str)
        self.records[key_of(record)] = record
        if self.root is not None:
            await asyncio.to_thread(self._append, line)

    def _append(self, line: str) -> None:
        with self._lock:
            if self._file is None:
                self._file = (self.root / SAMPLES).open("a", encoding="utf-8")
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())

    def rewrite(self, records: Iterable[dict[str, Any]], name: str = SAMPLES) -> Path:
        """Replace ``name`` atomically with ``records`` (``--reverify`` writes its re-graded samples this way)."""
        path = self.root / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
