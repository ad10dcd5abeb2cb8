"""An eval directory: ``eval.json`` (what the eval is) and ``samples.jsonl`` (one line per finished sample).

Durability: each sample's line is written to the file (one ``write``, flushed) the moment the sample completes, so a
killed eval (SIGKILL, Ctrl-C, a crash of the eval itself) loses nothing: the kernel holds every byte written. The
``fsync``s, which only matter if the machine itself goes down, are group-committed: a background thread syncs the
lines written since its last sync, at most every ``FSYNC_INTERVAL_S``, and ``close`` syncs the rest, so a clean exit
leaves every record on disk and a machine crash or power loss loses at most the records of the last
``FSYNC_INTERVAL_S`` plus one sync (those samples are simply run again on resume). A line torn by a kill or a crash,
and a zero-filled tail a crash can leave, are cut off when the directory is opened again. Re-running into the same
directory skips every sample already there, after checking that the model, split, sampling and env versions match
what produced them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from env_registry.errors import Error

SAMPLES = "samples.jsonl"
HEADER = "eval.json"
FSYNC_INTERVAL_S = 0.25  # the most a machine crash can lose of completed samples (a clean exit or a kill: nothing)

Key = tuple[str, int, int]  # (env_id, prompt_id, sample)


def key_of(record: dict[str, Any]) -> Key:
    return record["env_id"], int(record["prompt_id"]), int(record["sample"])


class SampleStore:
    """Samples of one eval, in memory and (with ``root``) on disk; ``add`` and ``close`` are called from one thread
    (the eval's event loop), the group-committed ``fsync`` runs in a thread of its own."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else None
        self.records: dict[Key, dict[str, Any]] = {}
        self.header: dict[str, Any] | None = None
        self._file = None
        self._syncer: threading.Thread | None = None
        self._dirty = threading.Event()  # lines written since the last fsync
        self._stop = threading.Event()
        self._sync_error: OSError | None = None
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
        data = path.read_bytes().rstrip(b"\0")  # a crash can leave the file's last blocks zero-filled
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
        if good < path.stat().st_size:
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

    def add(self, record: dict[str, Any]) -> None:
        """Keep ``record`` and, on disk, append it: written before this returns (a killed eval keeps it), ``fsync``-ed
        within ``FSYNC_INTERVAL_S`` (group commit) and at ``close``.

        Raises:
            Error: an earlier ``fsync`` of ``samples.jsonl`` failed (a full or failing disk), naming the file.
        """
        line = json.dumps(record, ensure_ascii=False, default=str)
        self.records[key_of(record)] = record
        if self.root is None:
            return
        self._raise_sync_error()
        if self._file is None:
            self._file = (self.root / SAMPLES).open("a", encoding="utf-8")
            self._stop.clear()
            self._syncer = threading.Thread(
                target=self._sync_loop, args=(self._file.fileno(),), name="samples-fsync", daemon=True
            )
            self._syncer.start()
        self._file.write(line + "\n")
        self._file.flush()
        self._dirty.set()

    def _sync_loop(self, fd: int) -> None:
        """One ``fsync`` for every batch of lines written, at most every ``FSYNC_INTERVAL_S``, until ``close``."""
        try:
            while True:
                self._dirty.wait()
                if self._stop.is_set():
                    return  # ``close`` syncs the rest
                self._dirty.clear()
                os.fsync(fd)
                if self._stop.wait(FSYNC_INTERVAL_S):
                    return
        except OSError as exc:
            self._sync_error = exc

    def _raise_sync_error(self) -> None:
        if self._sync_error is not None:
            raise Error(f"cannot fsync {self.root / SAMPLES}: {self._sync_error}; free disk space or use another --out")

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
        """Stop the sync thread and ``fsync`` what it has not: after this, every added record is on disk.

        Raises:
            Error: an ``fsync`` of ``samples.jsonl`` failed, naming the file.
        """
        if self._file is None:
            return
        self._stop.set()
        self._dirty.set()  # wake the thread if it waits for lines
        self._syncer.join()
        try:
            os.fsync(self._file.fileno())
        except OSError as exc:
            self._sync_error = self._sync_error or exc
        finally:
            self._file.close()
            self._file = None
        self._raise_sync_error()
