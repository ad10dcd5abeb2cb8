"""``molt-env view DIR``: an eval run's ``samples.jsonl`` rendered turn by turn, served on loopback.

- ``/`` is the run's summary (env IDs, model, pass@k, failures by reason) and a table of its episodes, narrowed by
  ``?env=``, ``?reward=`` (``pass``, ``fail`` or a number), ``?failure=`` (a reason, ``none`` or ``any``) and
  ``?min_len=``/``?max_len=`` (completion tokens), all server-side.
- ``/episodes/<i>`` is one episode: its messages by role, tool calls and their results, images (only PNG or JPEG
  bytes the run saved inline; any other image is left out), reward, score, ``info``, the failure and token counts.

Everything in the samples (model output, tool output, env feedback) is untrusted: the templates autoescape it, and
the pages carry the hub's headers with a CSP that runs no script and loads images from ``data:`` URLs only.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from env_registry.errors import Error
from env_registry.hub.pages import render

SAMPLES, SUMMARY = "samples.jsonl", "summary.json"  # what `molt-env eval --out DIR` writes (evaluation/)
CSP = "default-src 'none'; style-src 'self'; img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
MAX_ROWS = 1000  # episodes listed on the index at once
IMAGE_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg"}


class NoEpisode(Error, LookupError):
    """An episode number the run does not have (HTTP 404)."""


def load(root: Path) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """The run's samples in (env, prompt, sample) order, its ``summary.json`` ({} while the eval runs) and the
    number of lines that are not records (a torn tail); reads, never writes.

    Raises:
        Error: ``root`` has no ``samples.jsonl``.
    """
    path = root / SAMPLES
    if not path.is_file():
        raise Error(f"{path} does not exist: DIR must be the --out directory of `molt-env eval`")
    records, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line) if line.strip("\0 \t") else None
        except ValueError:
            record = None
        if isinstance(record, dict) and "env_id" in record:
            records.append(record)
        elif line.strip("\0 \t"):
            bad += 1
    try:
        summary = json.loads((root / SUMMARY).read_text())
    except (OSError, ValueError):
        summary = None
    summary = summary if isinstance(summary, dict) else {}
    envs = summary.get("envs") if isinstance(summary.get("envs"), dict) else {}
    order = {e: i for i, e in enumerate(envs)}

    for r in records:
        for key in ("prompt_id", "sample", "reward", "score", "turns", "prompt_tokens", "completion_tokens", "failure"):
            r.setdefault(key, None)
        r["env_id"] = str(r["env_id"])
        if r["failure"] is not None:  # a reason and a detail, as text, whatever the file holds
            failure = r["failure"] if isinstance(r["failure"], dict) else {"reason": r["failure"]}
            r["failure"] = {"reason": str(failure.get("reason")), "detail": str(failure.get("detail") or "")}
        per_env = envs.get(r["env_id"])
        r["_passed"] = _passed(r, (per_env if isinstance(per_env, dict) else summary).get("pass_threshold", 1.0))
        r["_preview"] = _preview(r.get("prompt"))
    records.sort(
        key=lambda r: (order.get(r["env_id"], len(order)), r["env_id"], _int(r, "prompt_id"), _int(r, "sample"))
    )
    return records, summary, bad


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


def _passed(record: dict[str, Any], threshold: Any) -> bool:
    reward = record.get("reward")
    number = isinstance(reward, int | float) and isinstance(threshold, int | float)
    return bool(record.get("completed")) and number and reward >= threshold - 1e-9


def _number(value: str, name: str) -> float | None:
    try:
        return float(value) if value.strip() else None
    except ValueError:
        raise Error(f"?{name}={value[:40]!r} is not a number") from None


def matches(record: dict[str, Any], env: str, reward: str, failure: str, low: float | None, high: float | None) -> bool:
    """Whether ``record`` passes the index's filters (an empty one keeps everything)."""
    reason = record["failure"]["reason"] if record["failure"] else None
    if env and record["env_id"] != env:
        return False
    if reward in ("pass", "fail") and record["_passed"] != (reward == "pass"):
        return False
    if reward not in ("", "pass", "fail") and record.get("reward") != _number(reward, "reward"):
        return False
    if failure and not (reason == failure or (failure == "none" and not reason) or (failure == "any" and reason)):
        return False
    length = record.get("completion_tokens")
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


def create_app(root: str | Path) -> FastAPI:
    """The viewer's app over the eval directory ``root`` (read again when its files change)."""
    root = Path(root).expanduser()
    load(root)  # a missing samples.jsonl fails here, before the server starts
    app = FastAPI(title="molt-env view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.private, app.state.root, app.state.cached = False, root, (None, None)
    app.mount("/static", StaticFiles(directory=Path(__file__).with_name("static")), name="static")

    def run() -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        stamp = tuple(
            (p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None for p in (root / SAMPLES, root / SUMMARY)
        )
        if app.state.cached[0] != stamp:
            app.state.cached = (stamp, load(root))
        return app.state.cached[1]

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        response = render(request, name, status_code, root=str(root), **context)
        response.headers["Content-Security-Policy"] = CSP
        return response

    @app.exception_handler(Error)
    async def refused(request: Request, exc: Error) -> HTMLResponse:
        code = 404 if isinstance(exc, NoEpisode) else 400
        return page(request, "viewer_error.html", code, status=code, message=str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> HTMLResponse:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        return page(request, "viewer_error.html", 400, status=400, message=f"invalid parameter(s): {fields}")

    @app.get("/", response_class=HTMLResponse)
    def index(
        request: Request, env: str = "", reward: str = "", failure: str = "", min_len: str = "", max_len: str = ""
    ) -> HTMLResponse:
        records, summary, bad = run()
        low, high = _number(min_len, "min_len"), _number(max_len, "max_len")
        shown = [(i, r) for i, r in enumerate(records) if matches(r, env, reward, failure, low, high)]
        pass_keys = sorted((k for k in summary if re.fullmatch(r"pass@\d+", k)), key=lambda k: int(k[5:]))
        env_ids = list(dict.fromkeys(r["env_id"] for r in records))
        return page(
            request,
            "viewer_index.html",
            summary=summary,
            pass_keys=pass_keys,
            env_ids=env_ids,
            total=len(records),
            bad=bad,
            shown=shown[:MAX_ROWS],
            matched=len(shown),
            max_rows=MAX_ROWS,
            filters={"env": env, "reward": reward, "failure": failure, "min_len": min_len, "max_len": max_len},
            reasons=sorted({r["failure"]["reason"] for r in records if r["failure"]}),
        )

    @app.get("/episodes/{i}", response_class=HTMLResponse)
    def episode(request: Request, i: int) -> HTMLResponse:
        records, _, _ = run()
        if not 0 <= i < len(records):
            raise NoEpisode(f"this run has episodes 0 to {len(records) - 1}, not {i}")
        r = records[i]
        return page(
            request,
            "viewer_episode.html",
            i=i,
            r=r,
            turns=turns(r),
            count=len(records),
            info=json.dumps(r.get("info"), indent=2, sort_keys=True, default=str),
            label=r.get("label") if isinstance(r.get("label"), str) else json.dumps(r.get("label")),
        )

    return app
