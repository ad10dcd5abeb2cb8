"""The hub: the registry's pages for people, server-rendered by Jinja2 (they work with JavaScript off).

- ``/`` searches (``?q=`` over names, env IDs, descriptions and tags; ``?tag=`` filters) and lists the newest and
  the most-installed packages.
- ``/packages/<pkg>`` shows versions (yanked ones with their reason), owner, license, install commands, file hashes
  and the README (``env_registry.hub.readme``: sanitized HTML).
- ``/envs/<ns>/<name>-vN`` is the env card: what the manifest declares, the validation report and eval summaries
  of each version, and the other versions of the ID.
- ``/login`` exchanges a token for an HttpOnly session cookie; on a ``--private`` server every page needs one (or
  a token, as the API does).

Everything a publisher wrote (README, manifest strings, summaries) is untrusted: templates autoescape it, the README
goes through the sanitizer, and every page carries a Content-Security-Policy that runs no script at all.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import APIRouter, Form, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates

from env_registry.errors import Error
from env_registry.hub import ecosystem_cards, readme
from env_registry.hub import versions as versions_
from env_registry.hub.access import SESSION_COOKIE, STATUS, logged_in, request_token
from env_registry.ids import parse_env_id
from env_registry.packages import names
from env_registry.store.credentials import SESSION_SECONDS
from env_registry.store.local import LocalRegistry, NotFound, PackageInfo, ReleaseInfo
from env_registry.validation.foreign import foreign_calibration

TEMPLATES = Path(__file__).with_name("templates")
MAX_QUERY_CHARS = 200
LISTED = 10  # packages in the newest / most-installed lists
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' https: data:; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
# manifest fields the env card shows in their own places; any other field is listed as it is
CARD_FIELDS = {"id", "entry_point", "kind", "description", "tags", "license", "reward_range", "modality", "tools"}
CARD_FIELDS |= {"datasets", "max_turns", "deterministic", "lifecycle"}


class LoginRequired(Error):
    """A private server's page was asked for without a session or token (HTTP 401, with the login form)."""


class BadQuery(Error, ValueError):
    """A query parameter the hub refuses (HTTP 400)."""


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["when"] = lambda ts: datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC") if ts else ""
    env.filters["size"] = lambda n: f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MB"
    env.filters["path"] = lambda text: quote(text, safe="/@")
    env.filters["json"] = lambda value: json.dumps(value, sort_keys=True)
    # a prompt template as the model reads it ({input} stays the placeholder; str.format's {{ }} become { })
    env.filters["template"] = lambda text: text.replace("{{", "{").replace("}}", "}")
    return Jinja2Templates(env=env)


templates = _templates()


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A page, with the security headers every page carries."""
    context.setdefault("viewer", getattr(request.state, "viewer", None))
    context.setdefault("private", request.app.state.private)
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


class PageRoute(APIRoute):
    """A hub route: registry errors and refused parameters become an HTML page with their status (the JSON API
    answers them as JSON), and the viewer is checked against the private-server rule first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                request.state.viewer = await run_in_threadpool(_viewer, request)
                return await handler(request)
            except LoginRequired as exc:
                return render(request, "login.html", 401, next=_next_path(request), error=str(exc))
            except RequestValidationError as exc:
                fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
                return render(request, "error.html", 400, status=400, message=f"invalid parameter(s): {fields}")
            except Error as exc:
                code = next((c for cls, c in STATUS.items() if isinstance(exc, cls)), 400)
                return render(request, "error.html", code, status=code, message=str(exc))

        return page


def _viewer(request: Request) -> str | None:
    """Who is logged in (a session cookie), or None; on a private server a page other than the login form needs a
    session or a token (as the API accepts it), else ``LoginRequired``."""
    viewer = logged_in(request)
    if viewer is None and request.app.state.private and request.url.path != "/login":
        token = request_token(request)
        if token is None or request.app.state.registry.token_publisher(token) is None:
            raise LoginRequired("this registry is private: log in with a token to read it")
    return viewer


def _next_path(request: Request) -> str:
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return path if _safe_next(path) else "/"


def _safe_next(path: str) -> bool:
    """Only a path on this server (no scheme, no host, no ``//``) may be where a login returns to."""
    return path.startswith("/") and not path.startswith(("//", "/\\")) and len(path) <= 2000


def _query(value: str, name: str) -> str:
    if len(value) > MAX_QUERY_CHARS:
        raise BadQuery(f"{name} is {len(value)} characters long; at most {MAX_QUERY_CHARS} are searched")
    return value.strip()


def _tags(package: PackageInfo) -> list[str]:
    return sorted({t for r in package.releases for m in r.manifests for t in m.get("tags", [])})


def _shown(package: PackageInfo, version: str | None) -> ReleaseInfo | None:
    """The release a page shows: ``version`` when given, else the latest non-yanked, else the newest."""
    if version:
        wanted = names.package_version(version)
        match = [r for r in package.releases if r.version == wanted]
        if not match:
            raise NotFound(
                f"{package.name} has no version {version!r}; versions: {[r.version for r in package.releases]}"
            )
        return match[0]
    latest = [r for r in package.releases if r.version == package.latest]
    return latest[0] if latest else (package.releases[-1] if package.releases else None)


def _card(package: PackageInfo) -> dict[str, Any]:
    shown = _shown(package, None)
    return {
        "name": package.name,
        "latest": package.latest,
        "summary": shown.summary if shown else "",
        "env_ids": package.env_ids,
        "tags": _tags(package),
        "downloads": sum(r.downloads for r in package.releases),
        "uploaded": max((r.uploaded for r in package.releases), default=0.0),
    }


def _calibration(report: dict[str, Any] | None, env_id: str) -> dict[str, Any] | None:
    """The env's reference-eval figures from the validation report, with its pass@k curve's SVG points (drawn by the
    template: no script)."""
    return _figures(((report or {}).get("calibration") or {}).get(env_id))


def _figures(figures: Any) -> dict[str, Any] | None:
    """Stored reference-eval figures as ``_calibration.html`` draws them (None: none)."""
    from env_registry.validation.calibration import curve_points

    if not isinstance(figures, dict):
        return None
    if figures.get("error"):
        return {"error": figures["error"], "policy": figures.get("policy")}
    passk = [v if isinstance(v, int | float) else 0.0 for v in figures.get("pass_at_k") or []]
    points = curve_points(passk)
    histogram = figures.get("reward_histogram") or []
    top = max(histogram, default=0) or 1
    keys = ("badge", "policy", "spec_hash", "split", "finished", "mean_reward", "num_prompts", "n", "failures")
    keys += ("turns_mean", "prompt_tokens_mean", "completion_tokens_mean", "seconds_mean", "sandbox_calls_mean")
    return {
        **dict.fromkeys(keys),
        **figures,
        "failures": figures.get("failures") or {},
        "reward_range": (figures.get("reward_range") or [None, None]) + [None, None],
        "reward_histogram": histogram,
        "passes_per_prompt": figures.get("passes_per_prompt") or [],
        "pass_at_k": figures.get("pass_at_k") or [],
        "error": None,
        "points": points,
        "polyline": " ".join(f"{x},{y}" for x, y in points),
        "bars": [(i, count, round(40 * count / top, 1)) for i, count in enumerate(histogram)],
    }


def hub_router() -> APIRouter:
    """The hub's routes (the app's ``state.registry`` and ``state.private`` are what they read)."""
    router = APIRouter(route_class=PageRoute, tags=["hub pages"], default_response_class=HTMLResponse)

    @router.get("/")
    def index(request: Request, q: str = "", tag: str = "") -> HTMLResponse:
        registry: LocalRegistry = request.app.state.registry
        q, tag = _query(q, "the search text"), _query(tag, "the tag")
        everything = registry.packages()
        tag_counts: dict[str, int] = {}
        for package in everything:
            for t in _tags(package):
                tag_counts[t] = tag_counts.get(t, 0) + 1
        results = None
        if q or tag:
            found = registry.search(q) if q else everything
            results = [_card(p) for p in found if not tag or tag in _tags(p)]
        cards = [_card(p) for p in everything]
        return render(
            request,
            "index.html",
            q=q,
            tag=tag,
            results=results,
            tags=sorted(tag_counts.items(), key=lambda item: (-item[1], item[0])),
            newest=sorted(cards, key=lambda c: -c["uploaded"])[:LISTED],
            most_installed=sorted(cards, key=lambda c: (-c["downloads"], c["name"]))[:LISTED],
            total=len(everything),
            schemes=ecosystem_cards.schemes(),
        )

    @router.get("/packages/{package}")
    def package_page(request: Request, package: str, version: str = "") -> Response:
        registry: LocalRegistry = request.app.state.registry
        info = registry.package(package)
        if info.name != package:  # one address per package, as PEP 503 redirects
            target = f"/packages/{info.name}" + (f"?version={quote(version)}" if version else "")
            return RedirectResponse(target, status_code=301)
        shown = _shown(info, version)
        text, content_type = registry.readme(info.name, shown.version) if shown else ("", None)
        licenses = sorted({m["license"] for m in shown.manifests if m.get("license")}) if shown else []
        return render(
            request,
            "package.html",
            package=info,
            shown=shown,
            readme=readme.render(text, content_type),
            licenses=licenses,
            base=str(request.base_url).rstrip("/"),
        )

    @router.get("/envs/{namespace}/{name}")
    def env_card(request: Request, namespace: str, name: str, version: str = "") -> HTMLResponse:
        return _env_card(request, f"{namespace}/{name}", version)

    @router.get("/envs/{name}")
    def root_env_card(request: Request, name: str, version: str = "") -> HTMLResponse:
        """The card of an env ID without a namespace."""
        return _env_card(request, name, version)

    @router.get("/envs/{namespace}/{name}/diff/{versions}")
    def env_diff(request: Request, namespace: str, name: str, versions: str) -> HTMLResponse:
        """What changed in the reference eval between two versions of an env: ``/envs/ns/name-v1/diff/1.0..1.1``."""
        return _env_diff(request, f"{namespace}/{name}", versions)

    @router.get("/envs/{name}/diff/{versions}")
    def root_env_diff(request: Request, name: str, versions: str) -> HTMLResponse:
        """The diff page of an env ID without a namespace."""
        return _env_diff(request, name, versions)

    def _env_diff(request: Request, env_id: str, versions: str) -> HTMLResponse:
        registry, entry, package, providing, _ = _env_entry(request, env_id)
        old, new = versions_.parse_range(versions)
        before = versions_.figures_of(registry, providing, entry.env_id, old)
        after = versions_.figures_of(registry, providing, entry.env_id, new)
        diff = versions_.calibration_diff(before, after)
        return render(request, "env_diff.html", entry=entry, package=package, old=old, new=new, diff=diff)

    def _env_entry(request: Request, env_id: str) -> tuple[LocalRegistry, Any, PackageInfo, list[ReleaseInfo], list]:
        """The registry, the env ID's index entry, its package, the releases providing it and its other ``-vN``."""
        registry: LocalRegistry = request.app.state.registry
        parsed = parse_env_id(env_id)
        if parsed.pin is not None:
            raise BadQuery(f"an env card is addressed without a package pin: /envs/{parsed.unpinned}?version=...")
        index = registry.env_ids()
        siblings = [e for e in index if parse_env_id(e.env_id).base == parsed.base]
        entry = next((e for e in siblings if e.env_id == parsed.unpinned), None)
        if entry is None:
            others = ", ".join(e.env_id for e in siblings) or "none"
            raise NotFound(f"no package in this registry provides {parsed.unpinned!r} (versions of it here: {others})")
        package = registry.package(entry.package)
        providing = [r for r in package.releases if r.version in entry.versions]
        return registry, entry, package, providing, siblings

    def _env_card(request: Request, env_id: str, version: str) -> HTMLResponse:
        if ecosystem_cards.is_foreign(env_id):
            if version:
                raise BadQuery(
                    f"{env_id} is another ecosystem's env: its version is the upstream library's, no ?version="
                )
            card = ecosystem_cards.card(env_id)
            scheme = env_id.partition(":")[0]
            calibration = _figures(foreign_calibration(request.app.state.registry, env_id))
            return render(
                request,
                "ecosystem_env.html",
                card=card,
                scheme=scheme,
                spec_hash=card["spec"].hash,
                calibration=calibration,
            )
        registry, entry, package, providing, siblings = _env_entry(request, env_id)
        shown = _shown(package.model_copy(update={"releases": providing}), version or entry.latest)
        if shown is None:
            raise NotFound(f"no release of {package.name} provides {entry.env_id!r}")
        manifest = next(m for m in shown.manifests if m["id"] == entry.env_id)
        status, report = registry.validation(package.name, shown.version)
        evals = [e for e in registry.evals(package.name, shown.version) if e.env_id == entry.env_id]
        pass_keys = sorted(
            {k for e in evals for k in e.summary if k.startswith("pass@")}, key=lambda k: int(k.split("@")[1])
        )
        rows = versions_.version_rows(registry, providing, entry.env_id)
        previous = next((r["compare"] for r in rows if r["release"].version == shown.version), None)
        changes = None
        if previous is not None:
            before = versions_.figures_of(registry, providing, entry.env_id, previous)
            changes = versions_.calibration_diff(before, versions_.calibration_of(report, entry.env_id) or {})
        return render(
            request,
            "env.html",
            entry=entry,
            package=package,
            providing=providing,
            shown=shown,
            manifest=manifest,
            extra={k: v for k, v in manifest.items() if k not in CARD_FIELDS and v not in (None, {}, [])},
            validation_status=status,
            validation_report=report,
            calibration=_calibration(report, entry.env_id),
            evals=evals,
            pass_keys=pass_keys,
            siblings=siblings,
            versions=rows,
            previous=previous,
            changes=changes,
        )

    @router.get("/sources/{scheme}")
    def source_page(request: Request, scheme: str) -> HTMLResponse:
        """Every ID of another ecosystem's scheme that the server's installed sources list, with availability."""
        entries = ecosystem_cards.catalog(_query(scheme, "the scheme"))
        return render(request, "source.html", scheme=scheme, entries=entries, schemes=ecosystem_cards.schemes())

    @router.get("/login")
    def login_form(request: Request, next: str = "/") -> HTMLResponse:
        return render(request, "login.html", next=next if _safe_next(next) else "/", error=None)

    @router.post("/login")
    def login(request: Request, token: str = Form(max_length=200), next: str = Form("/", max_length=2000)) -> Response:
        registry: LocalRegistry = request.app.state.registry
        session = registry.open_session(token.strip())
        target = next if _safe_next(next) else "/"
        if session is None:
            return render(request, "login.html", 403, next=target, error="that token is unknown or revoked")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            session,
            max_age=SESSION_SECONDS,
            expires=int(time.time()) + SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @router.post("/logout")
    def logout(request: Request) -> Response:
        session = request.cookies.get(SESSION_COOKIE)
        if session:
            request.app.state.registry.close_session(session)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict")
        return response

    return router
