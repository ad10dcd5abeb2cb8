"""``molt-env view DIR``: an eval run's ``samples.jsonl`` rendered turn by turn, served on loopback; the same pages
(``index_page``, ``episode_page``) serve an uploaded eval's episodes on the hub under ``/evals/<id>`` (``base``: the
path they hang from, ``eval_pages``).

- ``/`` is the run's summary (env IDs, model, pass@k, failures by reason, all from ``summary.json``) and a table of
  its episodes, ``PAGE_SIZE`` a page (``?page=N``, from 1), narrowed by ``?env=``, ``?reward=`` (``pass``, ``fail``
  or a number), ``?failure=`` (a reason, ``none`` or ``any``) and ``?min_len=``/``?max_len=`` (completion tokens),
  all server-side.
- ``/episodes/<i>`` is one episode: its messages by role, tool calls and their results, images (only PNG or JPEG
  bytes the run saved inline; any other image is left out), reward, score, ``info``, the failure and token counts.

Episodes are numbered in (env, prompt, sample) order. ``samples.jsonl`` is never loaded whole: once per version of
the file (its size and mtime) the viewer reads it line by line into an ``Index``, the byte offset, length and
(env, prompt, sample) of each record; a line as ``molt-env eval`` writes it gives those by a regular expression on
its first bytes, without JSON parsing (any other line is parsed). A page then parses only its ``PAGE_SIZE`` lines.
A filtered page needs every episode's reward, failure and length: the first one after the file changed parses each
line once (orjson when it is installed, else ``json``) into a ``Fields`` tuple per episode, kept with the index;
later filtered pages are a scan of those tuples plus their own lines. On a 10,000-episode eval of 46 MB
(``benchmarks/registry_bench.py``, 2 busy cores): the index 36 ms, the field scan 78 ms with orjson (158 ms with
json); the first page 45 ms cold (p50) and 7 ms warm, a filtered page 166 ms cold and 16 ms warm. At 189 MB: 62 ms,
230 ms; first page 62 ms cold, filtered 295 ms cold.

Everything in the samples (model output, tool output, env feedback) is untrusted: the templates autoescape it, and
the pages carry the hub's headers with a CSP that runs no script and loads images from ``data:`` URLs only.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import threading
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from env_registry.errors import Error
from env_registry.hub.pages import render
from env_registry.store.records import NotFound

try:  # optional: 2x faster than json on the field scan of filtered pages; a dependency of none of ours
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is in the dev environment
    _fast_loads = json.loads

SAMPLES, SUMMARY = "samples.jsonl", "summary.json"  # what `molt-env eval --out DIR` writes (evaluation/)
CSP = "default-src 'none'; style-src 'self'; img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
PAGE_SIZE = 100  # episodes listed on a page of the index
IMAGE_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg"}
BLANK = b"\0 \t\r\n"  # a crash can leave zero-filled blocks
# The start of a record as `molt-env eval` writes it (evaluation/run.py record_of, json.dumps): env, prompt, sample.
HEAD = re.compile(
    rb'\{"env_id": "([^"\\]*)", (?:"spec_hash": (?:"[^"\\]*"|null), )?'
    rb'(?:"package_version": (?:"[^"\\]*"|null), )?"prompt_id": (-?\d{1,18}), "sample": (-?\d{1,18})[,}]'
)


class NoEpisode(NotFound):
    """An episode number or a page the run does not have (HTTP 404)."""


class Fields(NamedTuple):
    """What the filters read of an episode."""

    reward: Any
    completed: bool
    reason: str | None
    completion_tokens: Any


class Index:
    """The records of one version of ``samples.jsonl`` in (env, prompt, sample) order: where each line is, its env,
    and (after ``fields``) what the filters read; ``bad`` counts non-blank lines that are not records."""

    def __init__(self, path: Path, env_order: dict[str, int]) -> None:
        self.path = path
        entries: list[tuple[tuple[int, str, int, int], int, int]] = []  # (sort key, offset, length)
        self.bad, offset, rank = 0, 0, len(env_order)
        with path.open("rb", buffering=1 << 20) as f:
            for line in f:
                start, offset = offset, offset + len(line)
                head = HEAD.match(line) if line.endswith(b"}\n") else None  # no copy of the line
                if head:  # an env ID with an escape in it is parsed below
                    env, prompt, sample = head[1].decode("utf-8", "replace"), int(head[2]), int(head[3])
                elif not line.strip(BLANK):
                    continue
                else:
                    record = _record(line)
                    if record is None:
                        self.bad += 1
                        continue
                    env, prompt, sample = record["env_id"], _int(record, "prompt_id"), _int(record, "sample")
                entries.append(((env_order.get(env, rank), env, prompt, sample), start, len(line)))
        entries.sort(key=lambda e: e[0])  # stable: equal keys stay in file order
        self.envs = [e[0][1] for e in entries]
        self.offsets = array("q", (e[1] for e in entries))
        self.lengths = array("q", (e[2] for e in entries))
        self._fields: list[Fields] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def record(self, i: int) -> dict[str, Any] | None:
        """Episode ``i``'s record, parsed now (None if its line does not parse as one)."""
        with self.path.open("rb") as f:
            f.seek(self.offsets[i])
            return _record(f.read(self.lengths[i]))

    def records(self, numbers: list[int]) -> list[dict[str, Any] | None]:
        """The records of episodes ``numbers``, read in file order through one open file."""
        out: dict[int, dict[str, Any] | None] = {}
        with self.path.open("rb") as f:
            for i in sorted(numbers, key=self.offsets.__getitem__):
                f.seek(self.offsets[i])
                out[i] = _record(f.read(self.lengths[i]))
        return [out[i] for i in numbers]

    def fields(self) -> list[Fields]:
        """Every episode's ``Fields``, by episode number: the whole file parsed once (orjson if installed)."""
        if self._fields is None:
            where = {offset: i for i, offset in enumerate(self.offsets)}
            fields: list[Fields] = [Fields(None, False, None, None)] * len(self.offsets)
            offset = 0
            with self.path.open("rb", buffering=1 << 20) as f:
                for line in f:
                    i, offset = where.get(offset), offset + len(line)
                    if i is not None:
                        fields[i] = _fields(_record(line, _fast_loads) or {})
            self._fields = fields
        return self._fields


def _record(line: bytes, loads: Any = json.loads) -> dict[str, Any] | None:
    """The record ``line`` holds, its fields normalized as the pages show them, or None."""
    try:
        record = loads(line)
    except ValueError:
        try:  # orjson refuses what json.dumps can write (NaN, huge integers); bytes that are not UTF-8
            record = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            return None
    if not isinstance(record, dict) or "env_id" not in record:
        return None
    for key in ("prompt_id", "sample", "reward", "score", "turns", "prompt_tokens", "completion_tokens", "failure"):
        record.setdefault(key, None)
    record["env_id"] = str(record["env_id"])
    if record["failure"] is not None:  # a reason and a detail, as text, whatever the file holds
        failure = record["failure"] if isinstance(record["failure"], dict) else {"reason": record["failure"]}
        record["failure"] = {"reason": str(failure.get("reason")), "detail": str(failure.get("detail") or "")}
    return record


def _fields(record: dict[str, Any]) -> Fields:
    failure = record.get("failure")
    reason = failure["reason"] if failure else None
    return Fields(record.get("reward"), bool(record.get("completed")), reason, record.get("completion_tokens"))


def read_summary(root: Path) -> dict[str, Any]:
    """The run's ``summary.json`` ({} while the eval runs, or if it is not a JSON object)."""
    try:
        summary = json.loads((root / SUMMARY).read_text())
    except (OSError, ValueError):
        summary = None
    return summary if isinstance(summary, dict) else {}


def thresholds(summary: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The pass threshold of each env of the summary, and the default one."""
    envs = summary.get("envs") if isinstance(summary.get("envs"), dict) else {}
    per_env = {e: s.get("pass_threshold", 1.0) for e, s in envs.items() if isinstance(s, dict)}
    return per_env, summary.get("pass_threshold", 1.0)


def load(root: Path) -> tuple[Index, dict[str, Any]]:
    """The run's ``Index`` and its ``summary.json``; reads, never writes.

    Raises:
        Error: ``root`` has no ``samples.jsonl``.
    """
    path = root / SAMPLES
    if not path.is_file():
        raise Error(f"{path} does not exist: DIR must be the --out directory of `molt-env eval`")
    summary = read_summary(root)
    envs = summary.get("envs") if isinstance(summary.get("envs"), dict) else {}
    return Index(path, {e: i for i, e in enumerate(envs)}), summary


def _int(record: dict[str, Any], key: str) -> int:
    return record[key] if isinstance(record.get(key), int) else -1


def _preview(prompt: Any) -> str:
    """The start of the prompt's last user message, on one line."""
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else ""
    if isinstance(prompt, list):
        prompt = " ".join(str(p.get("text", "")) for p in prompt if isinstance(p, dict))
    text = " ".join(str(prompt or "").split())
    return text[:100] + ("…" if len(text) > 100 else "")


def _passed(reward: Any, completed: bool, threshold: Any) -> bool:
    number = isinstance(reward, int | float) and isinstance(threshold, int | float)
    return bool(completed) and number and reward >= threshold - 1e-9


def _number(value: str, name: str) -> float | None:
    try:
        return float(value) if value.strip() else None
    except ValueError:
        raise Error(f"?{name}={value[:40]!r} is not a number") from None


def matches(
    fields: Fields,
    passed: bool,
    env_id: str,
    env: str,
    reward: str,
    failure: str,
    low: float | None,
    high: float | None,
) -> bool:
    """Whether an episode passes the index's filters (an empty one keeps everything)."""
    reason = fields.reason
    if env and env_id != env:
        return False
    if reward in ("pass", "fail") and passed != (reward == "pass"):
        return False
    if reward not in ("", "pass", "fail") and fields.reward != _number(reward, "reward"):
        return False
    if failure and not (reason == failure or (failure == "none" and not reason) or (failure == "any" and reason)):
        return False
    length = fields.completion_tokens
    if (low is not None or high is not None) and not isinstance(length, int | float):
        return False
    return (low is None or length >= low) and (high is None or length <= high)


def image(url: Any) -> str | None:
    """A ``data:`` URL of the PNG or JPEG bytes a base64 ``data:`` URL holds (re-encoded with the type its bytes
    have), else None: nothing remote, nothing that is not an image."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url[:100]:
        return None
    try:
        data = base64.b64decode(url.partition(";base64,")[2], validate=True)
    except (binascii.Error, ValueError):
        return None
    kind = next((t for magic, t in IMAGE_MAGIC.items() if data.startswith(magic)), None)
    return f"data:{kind};base64,{base64.b64encode(data).decode()}" if kind else None


def message(m: Any, where: str = "") -> dict[str, Any]:
    """One message as the episode page shows it: role, text, tool calls, images (and how many were left out)."""
    if not isinstance(m, dict):
        m = {"role": where or "text", "content": m if isinstance(m, str) else json.dumps(m, indent=1)}
    out = {"role": str(m.get("role", where or "?")), "text": "", "calls": [], "images": [], "skipped": 0}
    out["id"] = m.get("tool_call_id") or m.get("tool_use_id")
    texts: list[str] = []
    parts = m.get("content")
    for part in parts if isinstance(parts, list) else [parts]:
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, str):
            texts.append(part)
        elif part is None:
            continue
        elif kind in ("text", "input_text", "output_text"):
            texts.append(str(part.get("text", "")))
        elif kind in ("image_url", "input_image", "image"):
            url = part.get("image_url")
            src = part.get("source") or {}
            if isinstance(url, dict):
                url = url.get("url")
            if isinstance(src, dict) and src.get("type") == "base64":
                url = f"data:{src.get('media_type')};base64,{src.get('data', '')}"
            shown = image(url)
            if shown:
                out["images"].append(shown)
            else:
                out["skipped"] += 1
        elif kind == "tool_use":
            out["calls"].append({"name": part.get("name"), "arguments": json.dumps(part.get("input"), indent=1)})
        elif kind == "tool_result":
            out["id"] = part.get("tool_use_id")
            texts.append(message({"content": part.get("content")})["text"])
        else:
            texts.append(json.dumps(part, indent=1))
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        out["calls"].append({"name": fn.get("name"), "arguments": str(fn.get("arguments", ""))})
    out["text"] = "\n".join(texts)
    return out


def turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The episode's transcript as messages: chat messages as they are; a ChatAgent's recorded calls as each call's
    request messages not shown yet and its reply; an in-process engine's decoded context as text."""
    transcript = record.get("transcript")
    if not transcript:
        prompt = record.get("prompt")
        return [message(m) for m in (prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}])]
    if not isinstance(transcript, list):
        return [message(transcript, "transcript")]
    if not all(isinstance(c, dict) and "request" in c for c in transcript):
        return [message(m, "context") for m in transcript]
    out: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []  # the conversation the previous call sent, and its reply
    for i, call in enumerate(transcript, 1):
        request = call["request"] if isinstance(call["request"], dict) else {}
        sent = [message(m) for m in request.get("messages") or []]
        if request.get("system"):
            sent.insert(0, message({"role": "system", "content": request["system"]}))
        same = len(shown) if sent[: len(shown)] == shown else 0  # a continued conversation: only what it adds
        out.append(
            message({"role": "call", "content": f"model call {i} ({call.get('wire')}, HTTP {call.get('status')})"})
        )
        response = call.get("response") if isinstance(call.get("response"), dict) else {}
        replies = [
            message(c.get("message"), "assistant")
            for c in response.get("choices") or []
            if isinstance(c, dict) and c.get("message")
        ]
        if response.get("content") is not None:
            replies.append(message({"role": "assistant", "content": response["content"]}))
        if call.get("error"):
            replies.append(message({"role": "error", "content": str(call["error"])}))
        out += sent[same:] + replies
        shown = sent + replies
    return out


class Runs:
    """The ``Index`` and summary of eval directories, loaded again when a directory's files change; at most
    ``keep`` directories are held (least recently used first out)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._held: OrderedDict[Path, tuple[list[Any], tuple[Index, dict[str, Any]]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, root: Path) -> tuple[Index, dict[str, Any]]:
        """The run in ``root`` (``load``), indexed again if ``samples.jsonl`` or ``summary.json`` changed."""
        stamps: list[Any] = []
        for p in (root / SAMPLES, root / SUMMARY):
            try:
                stat = p.stat()
                stamps.append((stat.st_mtime_ns, stat.st_size, stat.st_ino))
            except OSError:
                stamps.append(None)
        with self._lock:
            held = self._held.get(root)
            if held is not None and held[0] == stamps:
                self._held.move_to_end(root)
                return held[1]
        run = load(root)
        with self._lock:
            self._held[root] = (stamps, run)
            self._held.move_to_end(root)
            while len(self._held) > self.keep:
                self._held.popitem(last=False)
        return run


def shown(index: Index, summary: dict[str, Any], numbers: list[int]) -> list[tuple[int, dict[str, Any]]]:
    """Episodes ``numbers`` as the index lists them: parsed now, a stub for a line that no longer parses."""
    per_env, default = thresholds(summary)
    out = []
    for i, r in zip(numbers, index.records(numbers), strict=True):
        if r is None:
            r = {"env_id": index.envs[i], "failure": {"reason": "unreadable", "detail": "not a JSON record"}}
            r.update(dict.fromkeys(("prompt_id", "sample", "reward", "turns", "prompt_tokens", "completion_tokens")))
        r["_passed"] = _passed(r.get("reward"), r.get("completed"), per_env.get(r["env_id"], default))
        r["_preview"] = _preview(r.get("prompt"))
        out.append((i, r))
    return out


def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A viewer page: the hub's ``render`` with the viewer's stricter policy (images from ``data:`` URLs only).
    ``context`` holds ``base`` (the path the run's pages hang from: "" for ``molt-env view``), ``root`` and
    ``back`` (a link to where the run came from on the hub, or None)."""
    response = render(request, name, status_code, **context)
    response.headers["Content-Security-Policy"] = CSP
    return response


def index_page(
    request: Request,
    run: tuple[Index, dict[str, Any]],
    filters: dict[str, str],
    page_number: int,
    **context: Any,
) -> HTMLResponse:
    """A page of a run's episodes: the unfiltered ones straight from the index; filtered ones by a scan of the
    index's ``Fields`` (built by the first filtered page after the file changed: every line parsed once).

    Args:
        request: the request.
        run: the run's ``Index`` and summary.
        filters: ``env``, ``reward``, ``failure``, ``min_len`` and ``max_len`` as the query gave them ("" for none).
        page_number: the page, from 1.
        context: ``base``, ``root`` and ``back`` (see ``page``).

    Raises:
        Error: a filter that is not a number where one is needed, or a page below 1 (HTTP 400).
        NoEpisode: a page past the last (HTTP 404).
    """
    index, summary = run
    env, reward, failure = filters["env"], filters["reward"], filters["failure"]
    low, high = _number(filters["min_len"], "min_len"), _number(filters["max_len"], "max_len")
    if reward not in ("", "pass", "fail"):
        _number(reward, "reward")
    if page_number < 1:
        raise Error(f"?page={page_number} is not a page: pages count from 1")
    if env or reward or failure or low is not None or high is not None:
        per_env, default = thresholds(summary)
        numbers = [
            i
            for i, (f, e) in enumerate(zip(index.fields(), index.envs, strict=True))
            if matches(f, _passed(f.reward, f.completed, per_env.get(e, default)), e, env, reward, failure, low, high)
        ]
        matched = len(numbers)
    else:
        numbers, matched = None, len(index)
    pages = max(1, math.ceil(matched / PAGE_SIZE))
    if page_number > pages:
        raise NoEpisode(f"?page={page_number}: these {matched} episodes fill {pages} page(s) of {PAGE_SIZE}")
    first = (page_number - 1) * PAGE_SIZE
    listed = list(range(first, min(first + PAGE_SIZE, matched))) if numbers is None else numbers[first:][:PAGE_SIZE]
    query = {k: v for k, v in filters.items() if v}

    def link(n: int) -> str:
        return f"{context['base']}/?" + urlencode({**query, "page": n})

    failures = summary.get("failures")
    if isinstance(failures, dict):  # the eval wrote them: no scan
        reasons = sorted(str(r) for r in failures)
    else:  # a running eval: its episodes' reasons so far (a scan)
        reasons = sorted({f.reason for f in index.fields() if f.reason})
    pass_keys = sorted((k for k in summary if re.fullmatch(r"pass@\d+", k)), key=lambda k: int(k[5:]))
    return page(
        request,
        "viewer_index.html",
        summary=summary,
        pass_keys=pass_keys,
        env_ids=list(dict.fromkeys(index.envs)),
        total=len(index),
        bad=index.bad,
        shown=shown(index, summary, listed),
        matched=matched,
        page=page_number,
        pages=pages,
        first=first,
        prev_link=link(page_number - 1) if page_number > 1 else None,
        next_link=link(page_number + 1) if page_number < pages else None,
        filters=filters,
        reasons=reasons,
        **context,
    )


def episode_page(request: Request, run: tuple[Index, dict[str, Any]], i: int, **context: Any) -> HTMLResponse:
    """Episode ``i`` of a run, turn by turn (``context``: ``base``, ``root``, ``back``, see ``page``).

    Raises:
        NoEpisode: the run has no episode ``i`` (HTTP 404).
    """
    index, summary = run
    if not 0 <= i < len(index):
        raise NoEpisode(f"this run has episodes 0 to {len(index) - 1}, not {i}")
    _, r = shown(index, summary, [i])[0]
    return page(
        request,
        "viewer_episode.html",
        i=i,
        r=r,
        turns=turns(r),
        count=len(index),
        info=json.dumps(r.get("info"), indent=2, sort_keys=True, default=str),
        label=r.get("label") if isinstance(r.get("label"), str) else json.dumps(r.get("label")),
        **context,
    )


def create_app(root: str | Path) -> FastAPI:
    """The viewer's app over the eval directory ``root`` (indexed again when its files change)."""
    root = Path(root).expanduser()
    load(root)  # a missing samples.jsonl fails here, before the server starts
    app = FastAPI(title="molt-env view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.private, app.state.root, app.state.runs = False, root, Runs(keep=1)
    app.mount("/static", StaticFiles(directory=Path(__file__).with_name("static")), name="static")
    where = {"base": "", "root": str(root), "back": None}

    @app.exception_handler(Error)
    async def refused(request: Request, exc: Error) -> HTMLResponse:
        code = 404 if isinstance(exc, NoEpisode) else 400
        return page(request, "viewer_error.html", code, status=code, message=str(exc), **where)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> HTMLResponse:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        return page(request, "viewer_error.html", 400, status=400, message=f"invalid parameter(s): {fields}", **where)

    @app.get("/", response_class=HTMLResponse)
    def index(
        request: Request,
        env: str = "",
        reward: str = "",
        failure: str = "",
        min_len: str = "",
        max_len: str = "",
        page_number: int = Query(1, alias="page"),
    ) -> HTMLResponse:
        filters = {"env": env, "reward": reward, "failure": failure, "min_len": min_len, "max_len": max_len}
        return index_page(request, app.state.runs.get(root), filters, page_number, **where)

    @app.get("/episodes/{i}", response_class=HTMLResponse)
    def episode(request: Request, i: int) -> HTMLResponse:
        return episode_page(request, app.state.runs.get(root), i, **where)

    return app
