"""``molt-env serve``: the registry server, a ``LocalRegistry`` behind FastAPI.

- The hub: server-rendered pages for people (``env_registry.hub.pages``): search, a page per package, an env card per
  env ID. ``--private`` pages need a login (a token, exchanged for an HttpOnly session cookie).
- JSON API under ``/api/``: packages, versions, env IDs, manifests, hashes, yanked state; publishing and yanking
  need a token (``Authorization: Bearer <token>``, or HTTP Basic with the token as password, which is what pip
  sends for ``http://__token__:<token>@host/...``). Reading is open unless the server runs ``--private``; then a
  token or the hub's session cookie is needed. Eval summaries are uploaded per release, with a token.
- ``/simple/``: a PEP 503 index of every package, with ``#sha256=`` fragments and PEP 592 ``data-yanked``;
  use it only as ``pip install --index-url`` (never ``--extra-index-url``, see the README).
- ``/p/<package>/simple/``: the same index scoped to one package. Any other project name is a 404 there, so when
  it is added next to PyPI, dependencies of the package can only come from PyPI: nothing in this registry can
  shadow them.
- ``/files/<package>/<file>``: the release files; each wheel download counts as an install of its version.
- ``--validate``: the publish gate. Every upload is stored ``pending`` and validated by a worker process of its own
  (``env_registry.validation.gate``); ``pending`` and ``failed`` versions are not resolvable and not on the simple
  index; ``/api/packages/<pkg>/<version>/validation`` serves the status and the report.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from env_registry.errors import Error
from env_registry.hub.access import STATUS, TOKEN_NEEDED, Publisher, Reader
from env_registry.hub.page_cache import PageCache
from env_registry.packages import names
from env_registry.packages.artifacts import InvalidArtifact, inspect_release
from env_registry.store.eval_summaries import MAX_SUMMARY_BYTES, parse_summary
from env_registry.store.local import (
    EnvIdInfo,
    EvalRecord,
    IndexLink,
    LocalRegistry,
    NotFound,
    PackageInfo,
    ReleaseInfo,
)

DEFAULT_MAX_UPLOAD_BYTES = 100 << 20
WORKER_CONFIG = "MOLT_SERVE_CONFIG"
FORM_PATHS = ("/login", "/logout")  # the hub's forms: posted by a browser, without a token
MAX_FORM_BYTES = 4096


class YankRequest(BaseModel):
    reason: str = Field(default="", max_length=1000)


class Health(BaseModel):
    ok: bool
    private: bool
    validate_uploads: bool = False


class Validation(BaseModel):
    """A release's publish-gate state: ``status`` None (never validated), ``pending``, ``passed`` or ``failed``."""

    package: str
    version: str
    status: str | None
    report: dict[str, Any] | None  # ValidationReport.to_json(); None until decided


def create_app(
    root: str | Path,
    private: bool = False,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    db: str | None = None,
    validate: bool = False,
) -> FastAPI:
    """The registry server's app.

    Args:
        root: the registry directory (the file store; also the SQLite database unless ``db`` is given).
        private: reading needs a token (or a hub login) too.
        max_upload_bytes: the largest request body accepted.
        db: the database URL (``postgresql://...``); default the SQLite file in ``root``.
        validate: the publish gate: store uploads ``pending`` (``serve`` starts the worker that decides them).

    Raises:
        DatabaseError: ``db`` is not a usable database URL.
    """
    from env_registry.hub.eval_pages import check_samples, eval_router
    from env_registry.hub.pages import hub_router

    registry = LocalRegistry(root, label="this registry", db=db)
    app = FastAPI(title="molt env registry", version="1")
    app.state.registry = registry
    app.state.private = private

    @app.exception_handler(Error)
    async def registry_error(request: Request, exc: Error) -> JSONResponse:
        return _error(next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 400), str(exc))

    @app.get("/api/health")
    def health() -> Health:
        return Health(ok=True, private=private, validate_uploads=validate)

    @app.get("/api/packages")
    def list_packages(_: Reader) -> list[PackageInfo]:
        return registry.packages()

    @app.get("/api/packages/{package}")
    def get_package(package: str, _: Reader) -> PackageInfo:
        return registry.package(package)

    @app.get("/api/packages/{package}/{version}")
    def get_release(package: str, version: str, _: Reader) -> ReleaseInfo:
        return registry.release(package, version)

    @app.get("/api/envs")
    def list_env_ids(_: Reader) -> list[EnvIdInfo]:
        return registry.env_ids()

    @app.get("/api/search")
    def search(_: Reader, q: Annotated[str, Query(max_length=200)] = "") -> list[PackageInfo]:
        return registry.search(q)

    @app.get("/api/resolve")
    def resolve(
        env_id: Annotated[str, Query(max_length=300, description="e.g. acme/echo-v1 or acme/echo-v1@1.0.2")], _: Reader
    ) -> ReleaseInfo:
        return registry.resolve(env_id)

    @app.post("/api/packages", status_code=201)
    def publish(
        wheel: Annotated[UploadFile, File()],
        sdist: Annotated[UploadFile, File()],
        who: Publisher,
        allow_same_content: Annotated[bool, Form()] = False,
    ) -> ReleaseInfo:
        staged = registry.staging / f"upload-{uuid.uuid4().hex}"
        staged.mkdir()
        try:
            paths = []
            for upload in (wheel, sdist):
                names.distribution_file(upload.filename or "")
                path = staged / str(upload.filename)
                with path.open("wb") as f:
                    shutil.copyfileobj(upload.file, f)
                paths.append(path)
            if len({p.name for p in paths}) != 2:
                raise InvalidArtifact("upload one wheel and one sdist, with different file names")
            return registry.publish(
                inspect_release(*paths),
                publisher=who,
                allow_same_content=allow_same_content,
                pending_validation=validate,
            )
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    @app.post("/api/packages/{package}/{version}/yank")
    def yank(package: str, version: str, body: YankRequest, who: Publisher) -> ReleaseInfo:
        return registry.yank(package, version, body.reason, publisher=who)

    @app.post(
        "/api/packages/{package}/{version}/evals",
        status_code=201,
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {}}}}},
    )
    async def publish_eval(package: str, version: str, request: Request, who: Publisher) -> EvalRecord:
        """Store the ``summary.json`` of ``molt-env eval`` for a release (any active token may upload one)."""
        body = await request.body()
        if len(body) > MAX_SUMMARY_BYTES:
            return _error(413, f"the summary is {len(body)} bytes; at most {MAX_SUMMARY_BYTES} are accepted")
        summary = parse_summary(body, "the uploaded summary")
        return await run_in_threadpool(registry.publish_eval, package, version, summary, who)

    @app.post(
        "/api/packages/{package}/{version}/evals/{eval_id}/samples",
        status_code=201,
        openapi_extra={  # the samples.jsonl file as it is (any Content-Type)
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        },
    )
    async def publish_eval_samples(
        package: str, version: str, eval_id: int, request: Request, who: Publisher
    ) -> EvalRecord:
        """Store the episodes (``samples.jsonl``, the lines of the eval's env) of an eval summary stored before, by
        its uploader; the hub then shows them at ``/evals/<id>/``."""
        staged = registry.staging / f"samples-{uuid.uuid4().hex}.jsonl"
        try:
            with staged.open("wb") as f:
                async for chunk in request.stream():
                    f.write(chunk)
            record = await run_in_threadpool(registry.eval_record, eval_id)
            await run_in_threadpool(check_samples, staged, record.env_id)
            return await run_in_threadpool(registry.publish_eval_samples, package, version, eval_id, staged, who)
        finally:
            staged.unlink(missing_ok=True)

    @app.get("/api/packages/{package}/{version}/evals")
    def list_evals(package: str, version: str, _: Reader) -> list[EvalRecord]:
        return registry.evals(package, version)

    @app.get("/api/packages/{package}/{version}/validation")
    def get_validation(package: str, version: str, _: Reader) -> Validation:
        """The publish gate's status of a release and its validation report."""
        info = registry.release(package, version)
        status, report = registry.validation(info.package, info.version)
        return Validation(package=info.package, version=info.version, status=status, report=report)

    @app.get("/simple/", response_class=HTMLResponse)
    def simple_root(request: Request, _: Reader) -> HTMLResponse:
        return _project_list(registry.packages(), request.scope.get("root_path", "") + "/simple")

    @app.get("/simple/{project}/", response_class=HTMLResponse)
    def simple_project(project: str, request: Request, _: Reader) -> Any:
        return _project_page(registry, project, request, "/simple")

    @app.get("/p/{package}/simple/", response_class=HTMLResponse)
    def scoped_root(package: str, request: Request, _: Reader) -> HTMLResponse:
        name = names.package_name(package)
        return _project_list([registry.package(name)], f"{request.scope.get('root_path', '')}/p/{name}/simple")

    @app.get("/p/{package}/simple/{project}/", response_class=HTMLResponse)
    def scoped_project(package: str, project: str, request: Request, _: Reader) -> Any:
        if names.package_name(project) != names.package_name(package):
            raise NotFound(f"this index is scoped to {names.package_name(package)!r}; {project!r} is not served here")
        return _project_page(registry, project, request, f"/p/{names.package_name(package)}/simple")

    @app.get("/files/{package}/{filename}")
    def download(package: str, filename: str, _: Reader) -> FileResponse:
        path = registry.file_path(package, filename)
        registry.count_download(path.parent.name, path.name)
        return FileResponse(path, media_type="application/octet-stream")

    app.include_router(hub_router())
    app.include_router(eval_router())
    app.mount("/static", StaticFiles(directory=Path(__file__).with_name("static")), name="static")
    app.add_middleware(PageCache, registry=registry, private=private)
    app.add_middleware(UploadLimit, max_upload_bytes=max_upload_bytes)  # outermost: before any body is read
    return app


class UploadLimit:
    """ASGI middleware refusing an upload before its body is read: one without a token (the hub's forms aside),
    without a Content-Length, or larger than the server accepts. (Plain ASGI: Starlette's ``@app.middleware`` costs
    a task and two memory streams per request, the GETs included.)

    Args:
        app: the application it wraps.
        max_upload_bytes: the largest request body accepted (``MAX_FORM_BYTES`` for a form).
    """

    def __init__(self, app: ASGIApp, max_upload_bytes: int) -> None:
        self.app = app
        self.max_upload_bytes = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            refusal = self._refusal(scope)
            if refusal is not None:
                return await refusal(scope, receive, send)
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        form = scope["path"] in FORM_PATHS
        if not form and "authorization" not in headers:  # refuse before reading (and spooling) any body
            return _error(401, TOKEN_NEEDED)
        length = headers.get("content-length")
        if length is None or not length.isdigit():
            return _error(411, "send a Content-Length header (chunked uploads are refused)")
        limit = MAX_FORM_BYTES if form else self.max_upload_bytes
        if int(length) > limit:
            return _error(
                413, f"the upload is {int(length)} bytes; this registry accepts at most {limit} bytes per request"
            )
        return None


def _error(status: int, detail: str) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Basic realm="molt"'} if status == 401 else None
    return JSONResponse({"detail": detail}, status, headers=headers)


def _project_list(packages: list[PackageInfo], base: str) -> HTMLResponse:
    links = "".join(f'<a href="{base}/{p.name}/">{p.name}</a><br>\n' for p in packages)
    return HTMLResponse(_page("Simple index", links))


def _project_page(registry: LocalRegistry, project: str, request: Request, base: str) -> Any:
    name = names.package_name(project)
    root = request.scope.get("root_path", "")
    if name != project:  # PEP 503: redirect to the normalized name
        return RedirectResponse(f"{root}{base}/{name}/", status_code=301)
    links = "".join(_anchor(root, link) for link in registry.index_links(name))
    return HTMLResponse(_page(f"Links for {name}", links))


def _anchor(root: str, link: IndexLink) -> str:
    attrs = ""
    if link.requires_python:
        attrs += f' data-requires-python="{html.escape(link.requires_python)}"'
    if link.yanked:
        attrs += f' data-yanked="{html.escape(link.yanked_reason or "")}"'
    href = html.escape(f"{root}/{urllib.parse.quote(link.url)}#sha256={link.sha256}")
    return f'<a href="{href}"{attrs}>{html.escape(link.filename)}</a><br>\n'


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{html.escape(title)}</title></head>\n<body><h1>{html.escape(title)}</h1>\n{body}</body></html>\n"
    )


def serve(
    root: str | Path,
    host: str = "127.0.0.1",
    port: int = 8080,
    private: bool = False,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    db: str | None = None,
    workers: int = 1,
    validate: bool = False,
    validate_timeout_s: float = 600.0,
    gate_argv: Sequence[str] = (),
) -> None:
    """Run the server under uvicorn until interrupted (arguments as ``create_app``; ``workers`` > 1 runs that many
    server processes on one port, each with its own connections to the one database). With ``validate``, the
    publish gate's worker process (``env_registry.validation.gate``, ``validate_timeout_s`` per package) runs
    alongside and ends with the server; ``gate_argv`` is added to its command line (the reference policy's flags)."""
    import uvicorn

    gate = None
    if validate:
        cmd = [sys.executable, "-m", "env_registry.validation.gate", "--root", str(root)]
        cmd += ["--timeout", str(validate_timeout_s), *(["--db", db] if db else []), *gate_argv]
        # its own process group (the gate ends it, pip and jail children included, when its stdin closes)
        gate = subprocess.Popen(cmd, stdin=subprocess.PIPE, start_new_session=True)
    try:
        if workers <= 1:
            app = create_app(root, private, max_upload_bytes, db, validate)
            uvicorn.run(app, host=host, port=port, log_level="warning")
            return
        config = {"root": str(root), "private": private, "max_upload_bytes": max_upload_bytes, "db": db}
        os.environ[WORKER_CONFIG] = json.dumps({**config, "validate": validate})  # read by app_from_environment
        uvicorn.run(
            "env_registry.hub.app:app_from_environment",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="warning",
        )
    finally:
        if gate is not None:
            gate.stdin.close()  # type: ignore[union-attr]
            try:
                gate.wait(10)
            except subprocess.TimeoutExpired:
                gate.kill()


def app_from_environment() -> FastAPI:
    """The app of one ``molt-env serve --workers N`` process (uvicorn calls this factory in each)."""
    return create_app(**json.loads(os.environ[WORKER_CONFIG]))
