"""``molt-env``: list, inspect and check environments; scaffold, build, publish, serve, search, install and yank
env packages; serve an installed env to other processes (``serve-env``); browse an eval's samples (``view``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from env_registry.conformance import check
from env_registry.datasets import count_rows
from env_registry.errors import Error
from env_registry.ids import parse_env_id
from env_registry.registry import registry
from env_registry.sources import for_scheme, sources
from env_registry.validation.calibration import (
    add_reference_flags,
    check_reference_flags,
    given_reference_flags,
    reference_argv,
    reference_policy,
)

SERVER_EXTRA = {"fastapi", "uvicorn", "httpx", "multipart", "python_multipart", "build", "hatchling"}
SERVER_EXTRA |= {"sqlalchemy", "alembic", "psycopg", "jinja2", "markdown_it", "nh3"}


def cmd_list(args: argparse.Namespace) -> int:
    """Every ID grouped by namespace, with kind, modality, turns and tags; ``--tag`` keeps IDs carrying that tag;
    ``--source SCHEME`` lists what another ecosystem's scheme can name instead, each with its availability."""
    if args.source:
        return _list_source(args.source)
    specs = [registry[i] for i in sorted(registry)]
    if args.tag:
        specs = [s for s in specs if args.tag in s.tags]
        if not specs:
            known = sorted({t for i in registry for t in registry[i].tags})
            raise Error(f"no env is tagged {args.tag!r}; tags in use: {', '.join(known)}")
    groups: dict[str, list] = {}
    for s in specs:
        groups.setdefault(parse_env_id(s.id).namespace or "(no namespace)", []).append(s)
    width = max(len(s.id) for s in specs)
    for namespace, members in groups.items():
        print(f"===== {namespace} =====")
        for s in members:
            turns = "?" if s.max_turns is None else str(s.max_turns)
            print(f"  {s.id:<{width}}  {s.kind:<10} {s.modality:<6} turns {turns:<3} {', '.join(s.tags)}")
    return 0


def _list_source(scheme: str) -> int:
    found = [source for source in sources() if scheme in source.schemes]
    if not found:
        known = sorted({s for source in sources() for s in source.schemes})
        raise Error(f"no ID scheme {scheme!r}; known schemes: {', '.join(known)}")
    entries = found[0].catalog()
    if not entries:
        raise Error(f"the {scheme}: scheme has no catalog to list (its IDs name things it finds when asked)")
    width = max(len(e.env_id) for e in entries)
    for e in entries:
        status = "available" if e.available else f"unavailable: {e.reason}"
        print(f"  {e.env_id:<{width}}  {e.kind:<5} {status}" + (f"  -- {e.description}" if e.description else ""))
    ready = sum(e.available for e in entries)
    print(f"{len(entries)} IDs of {scheme}:, {ready} available, {len(entries) - ready} unavailable")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    spec = registry.spec(args.env_id)
    splits = {}
    for split, cfg in spec.datasets.items():
        if cfg.generator is not None and isinstance(cfg.kwargs.get("size"), int):
            splits[split] = {"source": cfg.generator, "kwargs": cfg.kwargs, "size": cfg.kwargs["size"]}
            continue  # a generator's declared size: generating thousands of rows only to count them is slow
        try:
            rows: int | str = count_rows(spec, split)
        except Error as exc:
            rows = f"unavailable ({exc})"
        splits[split] = {"source": cfg.path or cfg.generator, "rows": rows}
    info = {
        "id": spec.id,
        "hash": spec.hash,
        "package": spec.package,
        "package_version": spec.package_version,
        "upstream": spec.upstream,
        "spec": spec.model_dump(mode="json"),
        "datasets": splits,
        "card": spec.card.model_dump() if spec.card else None,
        "tools": [t.model_dump() for t in spec.tools],
    }
    print(json.dumps(info, indent=2))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    if (Path(args.target) / "pyproject.toml").is_file():
        from env_registry.packages.source_check import check_source

        passed, text = check_source(args.target)
        print(text)
        return 0 if passed else 1
    from env_registry.serving.urls import is_url

    server_options = [args.protocol, args.sessions, args.max_sessions, args.timeout]
    if any(o is not None for o in server_options) and not is_url(args.target):
        raise Error("--protocol, --sessions, --max-sessions and --timeout check an env server: give its URL")
    if is_url(args.target):
        from env_registry.serving.server_check import parse_target

        try:
            parse_target(args.target, args.protocol or "molt-env/1")
        except ValueError as exc:
            raise Error(str(exc)) from None
    reports = []
    if (args.protocol or "molt-env/1") == "molt-env/1":  # the env itself, through the server, as a trainer uses it
        reports.append(check(args.target))
    if is_url(args.target):
        from env_registry.serving.server_check import server_report

        options = {"timeout_s": args.timeout} if args.timeout is not None else {}
        options |= {"sessions": args.sessions} if args.sessions is not None else {}
        reports.append(
            server_report(args.target, args.protocol or "molt-env/1", max_sessions=args.max_sessions, **options)
        )
    print("\n\n".join(report.render() for report in reports))
    if args.protocol == "openenv" and args.max_sessions is None:
        print("(CAPACITY_REACHED not checked: OpenEnv servers do not publish their limit; add --max-sessions N)")
    return 0 if all(report.passed for report in reports) else 1


def cmd_init(args: argparse.Namespace) -> int:
    from env_registry.packages.scaffold import init

    root = init(args.directory, args.id, kind=args.kind, package=args.package)
    print(f"created {root}: env {args.id} ({args.kind}); next: molt-env check {root} && molt-env build {root}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from env_registry.packages.build import build

    release = build(args.directory, args.out, isolated=args.isolated)
    print(
        json.dumps(
            {
                "package": release.name,
                "version": release.version,
                "env_ids": release.env_ids,
                "content_hash": release.content_hash,
                "wheel": str(release.wheel),
                "sdist": str(release.sdist),
            },
            indent=2,
        )
    )
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    import tempfile
    import time

    from env_registry.packages.build import build
    from env_registry.store.client import open_registry
    from env_registry.store.validation_states import PASSED, PENDING
    from env_registry.validation.report import ValidationReport

    target = open_registry(args.registry, args.token)
    with tempfile.TemporaryDirectory(prefix="molt-publish-") as out:
        release = build(args.directory, out)
        info = target.publish(release, allow_same_content=args.allow_same_content)
    print(
        f"published {info.package} {info.version} ({', '.join(info.env_ids)}) to {target}; "
        f"content hash {info.content_hash[:16]}",
        flush=True,
    )
    if info.validation_status != PENDING:
        return 0
    if args.no_wait:
        print(f"validation pending: see /api/packages/{info.package}/{info.version}/validation")
        return 0
    print(f"waiting for {target}'s publish gate to validate it (at most {args.wait:g} s)...", flush=True)
    deadline = time.monotonic() + args.wait
    status, report = target.validation(info.package, info.version)
    while status == PENDING and time.monotonic() < deadline:
        time.sleep(1.0)
        status, report = target.validation(info.package, info.version)
    if status == PENDING:
        raise Error(f"still pending after {args.wait:g} s; see /api/packages/{info.package}/{info.version}/validation")
    print(ValidationReport.from_json(report).render() if report else f"validation: {status}")
    if status != PASSED:
        print(f"{info.package} {info.version} failed validation: it is not installable; publish a fixed version")
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from env_registry.hub.app import serve
    from env_registry.store.local import LocalRegistry

    if not args.validate and given_reference_flags(args):
        raise Error(
            f"{', '.join(given_reference_flags(args))} set the publish gate's calibration, which runs only with "
            "--validate: add --validate, or drop them"
        )
    stamp = check_reference_flags(args)  # a path that is no checkpoint fails before anything starts
    store = LocalRegistry(args.root, db=args.db)  # migrates the database before the server starts
    if args.mint_token:
        token_id, token = store.mint_token(args.mint_token)
        print(f"minted token {token_id} for publisher {args.mint_token!r} (shown once): {token}", flush=True)
    store.close()
    print(
        f"serving {store.root} ({store.url.render_as_string(hide_password=True)}) at http://{args.host}:{args.port}/ "
        f"(hub: /, simple index: /simple/, JSON API: /api/, docs: /docs){' [private]' if args.private else ''}",
        flush=True,
    )
    with reference_policy(args, stamp) as reference:  # a --reference-checkpoint is served until the server stops
        if reference is not None and reference.checkpoint:
            print(f"serving the reference checkpoint at {reference.endpoint} ({reference.label})", flush=True)
        serve(
            args.root,
            args.host,
            args.port,
            private=args.private,
            max_upload_bytes=int(args.max_upload_mb * 2**20),
            db=args.db,
            workers=args.workers,
            validate=args.validate,
            validate_timeout_s=args.validate_timeout,
            gate_argv=reference_argv(reference),
        )
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from env_registry.store.local import LocalRegistry

    store = LocalRegistry(args.root, db=args.db)
    if args.action == "mint":
        token_id, token = store.mint_token(args.publisher)
        print(f"token {token_id} for publisher {args.publisher!r} (store it now; only its hash is kept):\n{token}")
    elif args.action == "revoke":
        if args.id is None:
            raise Error("give the id of the token to revoke (see `molt-env token list`)")
        print(f"revoked token {store.revoke_token(args.id).id}")
    else:
        for token in store.tokens():
            print(f"{token.id}\t{token.publisher}\t{'revoked' if token.revoked else 'active'}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from env_registry.store.client import open_registry

    found = open_registry(args.registry, args.token).search(args.query)
    for package in found:
        summary = package.releases[-1].summary if package.releases else ""
        print(f"{package.name} {package.latest or '(all yanked)'}  {', '.join(package.env_ids)}  {summary}")
    if not found:
        print(f"nothing matches {args.query!r}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from env_registry.installs.install import install
    from env_registry.store.client import open_registry

    info = install(args.env_id, open_registry(args.registry, args.token), python=args.python, isolated=args.isolated)
    if info.yanked:
        print(
            f"warning: {info.package} {info.version} is yanked: {info.yanked_reason or '(no reason given)'}",
            file=sys.stderr,
        )
    where = " into a venv of its own (make() and --env serve it from there)" if args.isolated else ""
    print(
        f"installed {info.package} {info.version}{where} (provides {', '.join(info.env_ids)}; wheel sha256 "
        f"{info.wheel.sha256[:16]} verified)"
    )
    return 0


def cmd_ecosystem(args: argparse.Namespace) -> int:
    """``molt-env ecosystem install SCHEME --with PKG``: the venv of its own an ecosystem's envs run in."""
    source = for_scheme(f"{args.name}:")
    if source is None or not hasattr(source, "install"):
        own = sorted(scheme for s in sources() if hasattr(s, "install") for scheme in s.schemes)
        raise Error(f"no ecosystem {args.name!r} has a venv of its own; those that do: {', '.join(own) or 'none'}")
    print(source.install(args.packages))
    return 0


def cmd_serve_env(args: argparse.Namespace) -> int:
    from env_registry.installs.isolated import records
    from env_registry.remote import RemoteEnvSpec
    from env_registry.serving.serve_env import serve_env
    from env_registry.serving.urls import is_url

    if args.protocol == "openenv":
        return _serve_openenv(args)
    if args.max_sessions is not None or args.session_timeout is not None:
        flag = "--max-sessions" if args.max_sessions is not None else "--session-timeout"
        raise Error(f"{flag} acts on --protocol openenv only; the molt-env/1 protocol takes --max-episodes")
    if len(args.env_ids) > 1:
        raise Error(f"--protocol molt-env/1 serves one ID per process, got {args.env_ids}; use --protocol openenv")
    args.env_id = args.env_ids[0]
    if is_url(args.env_id):
        raise Error(f"{args.env_id} is already served; serve-env takes a registered ID such as ns/name-v1")
    python = args.python
    if python is None and for_scheme(args.env_id) is None:  # another ecosystem's ID is served from here
        spec = registry.spec(args.env_id)
        if isinstance(spec, RemoteEnvSpec):  # an isolated install: serve it from its own venv
            python = next(r.python for r in records() if (r.package, r.version) == (spec.package, spec.package_version))
    if python is not None:
        path = Path(python).expanduser()
        path = path / "bin" / "python" if path.is_dir() else path
        if not path.is_file():
            raise Error(f"--python {python!r} is neither a venv directory nor a python interpreter")
        argv = [str(path), "-m", "env_registry.cli", "serve-env", args.env_id, "--host", args.host, "--port"]
        argv += [str(args.port)] + (["--max-episodes", str(args.max_episodes)] if args.max_episodes else [])
        os.execv(str(path), argv + (["--exit-on-stdin-eof"] if args.exit_on_stdin_eof else []))
    if args.max_episodes is not None and args.max_episodes < 1:
        raise Error(f"--max-episodes must be >= 1, got {args.max_episodes}")
    try:
        serve_env(args.env_id, args.host, args.port, args.max_episodes, exit_on_stdin_eof=args.exit_on_stdin_eof)
    except OSError as exc:
        raise Error(str(exc)) from None
    return 0


def _serve_openenv(args: argparse.Namespace) -> int:
    for flag, value in (("--max-episodes", args.max_episodes), ("--python", args.python)):
        if value is not None:
            raise Error(f"{flag} acts on --protocol molt-env/1 only; with --protocol openenv use --max-sessions")
    try:
        from env_registry.ecosystems.openenv.server import openenv_app
    except ImportError as exc:
        raise Error(f"--protocol openenv needs OpenEnv ({exc}); pip install 'molt-ecosystem[openenv]'") from None
    from molt_envs.remote.server import serve

    max_sessions = 64 if args.max_sessions is None else args.max_sessions
    if max_sessions < 1:
        raise Error(f"--max-sessions must be >= 1, got {max_sessions}")
    timeout = 600.0 if args.session_timeout is None else args.session_timeout
    app = openenv_app(args.env_ids, max_sessions=max_sessions, session_timeout_s=timeout if timeout > 0 else None)

    def ready(base_url: str) -> None:
        where = [f"{base_url}/{i}" for i in args.env_ids] if len(args.env_ids) > 1 else [base_url]
        print(f"molt-env serve-env: serving {', '.join(args.env_ids)} at {', '.join(where)} (OpenEnv)", flush=True)

    try:
        serve(app, args.host, args.port, on_ready=ready, exit_on_stdin_eof=args.exit_on_stdin_eof)
    except OSError as exc:
        raise Error(str(exc)) from None
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from env_registry.hub.viewer import create_app
    from molt_envs.remote.server import serve

    app = create_app(args.directory)  # a directory without samples.jsonl fails here (exit 2)

    def ready(base_url: str) -> None:
        print(f"molt-env view: serving {app.state.root} at {base_url}/ (Ctrl-C stops it)", flush=True)

    try:
        serve(app, "127.0.0.1", args.port, on_ready=ready)
    except OSError as exc:
        raise Error(str(exc)) from None
    return 0


def cmd_yank(args: argparse.Namespace) -> int:
    from env_registry.store.client import open_registry

    if parse_env_id(args.env_id).pin is None:
        raise Error(f"yank needs an exact package version: write '{args.env_id}@<version>'")
    target = open_registry(args.registry, args.token)
    info = target.resolve(args.env_id)
    info = target.yank(info.package, info.version, args.reason)
    print(
        f"yanked {info.package} {info.version}: {info.yanked_reason}; `molt-env install {args.env_id}` still "
        "installs it, unpinned IDs skip it"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="molt-env", description="Versioned LLM-agent environments.")
    sub = parser.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="every registered ID, grouped by namespace (kind, modality, turns, tags)")
    lst.add_argument("--tag", help="only IDs with this tag (e.g. game, reasoning-gym, math)")
    lst.add_argument("--source", metavar="SCHEME", help="every ID another ecosystem's scheme can name (rg, ...)")
    lst.set_defaults(fn=cmd_list)
    info = sub.add_parser("info", help="spec, manifest, datasets and tools of one env")
    info.add_argument("env_id")
    info.set_defaults(fn=cmd_info)
    chk = sub.add_parser("check", help="conformance check; exit 1 with a report on failure")
    chk.add_argument("target", help="an env ID, a package source directory, or an env server's URL")
    chk.add_argument(
        "--protocol",
        choices=["molt-env/1", "openenv"],
        help="a URL: the server's protocol (default molt-env/1); runs the server conformance suite too",
    )
    chk.add_argument("--sessions", type=int, help="a URL: concurrent episodes of the concurrency check (default 16)")
    chk.add_argument(
        "--max-sessions",
        type=int,
        help="a URL: the server's session limit; the concurrency check stays within it, and (openenv) one more "
        "session must be answered CAPACITY_REACHED",
    )
    chk.add_argument("--timeout", type=float, help="a URL: seconds each server check may take (default 30)")
    chk.set_defaults(fn=cmd_check)

    ini = sub.add_parser("init", help="scaffold a new env package")
    ini.add_argument("directory")
    ini.add_argument("--id", required=True, help="the env ID it provides, e.g. acme/echo-v1")
    ini.add_argument("--kind", choices=["env", "chat_agent"], default="env")
    ini.add_argument("--package", help="the distribution name (default: <namespace>-<name>)")
    ini.set_defaults(fn=cmd_init)

    bld = sub.add_parser("build", help="wheel + sdist + content hash, after validating the manifest")
    bld.add_argument("directory")
    bld.add_argument("--out", help="output directory (default: <directory>/dist)")
    iso = bld.add_mutually_exclusive_group()
    iso.add_argument(
        "--isolated",
        action="store_true",
        default=None,
        help="always build in an isolated environment (needs the package index)",
    )
    iso.add_argument(
        "--no-isolation",
        dest="isolated",
        action="store_false",
        help="build with this interpreter's backend (default when it has one)",
    )
    bld.set_defaults(fn=cmd_build)

    def db_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--db",
            default=os.environ.get("MOLT_REGISTRY_DB"),
            help="the registry database: postgresql://user:pass@host/db for a team deployment "
            "(default: $MOLT_REGISTRY_DB, else the SQLite file <root>/registry.db)",
        )

    def registry_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--registry", help="a directory or http(s) URL (default: $MOLT_REGISTRY or ~/.molt/registry)")
        p.add_argument("--token", default=os.environ.get("MOLT_TOKEN"), help="registry token (default: $MOLT_TOKEN)")

    pub = sub.add_parser("publish", help="build a source tree and publish it to a registry")
    pub.add_argument("directory")
    registry_args(pub)
    pub.add_argument(
        "--allow-same-content", action="store_true", help="publish even if an earlier version has identical content"
    )
    pub.add_argument(
        "--wait", type=float, default=900.0, help="seconds to wait for a publish gate's verdict (default 900)"
    )
    pub.add_argument("--no-wait", action="store_true", help="do not wait for a publish gate's verdict")
    pub.set_defaults(fn=cmd_publish)

    srv = sub.add_parser("serve", help="run the registry server over a registry directory")
    srv.add_argument("--root", default=os.environ.get("MOLT_REGISTRY", "~/.molt/registry"))
    db_arg(srv)
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8080)
    srv.add_argument("--private", action="store_true", help="reading needs a token too")
    srv.add_argument("--max-upload-mb", type=float, default=100.0)
    srv.add_argument("--workers", type=int, default=1, help="server processes on the port (default 1)")
    srv.add_argument("--mint-token", metavar="PUBLISHER", help="mint a publish token for PUBLISHER and print it")
    srv.add_argument(
        "--validate",
        action="store_true",
        help="the publish gate: validate every upload in a worker process (molt-env validate, in the sandbox jail); "
        "an upload is not installable until it passes",
    )
    srv.add_argument("--validate-timeout", type=float, default=600.0, help="wall-clock limit of each validation (s)")
    add_reference_flags(srv)
    srv.set_defaults(fn=cmd_serve)

    tok = sub.add_parser("token", help="mint, list or revoke the publish tokens of a registry directory")
    tok.add_argument("action", choices=["mint", "list", "revoke"])
    tok.add_argument("id", nargs="?", type=int, help="token id (revoke)")
    tok.add_argument("--root", default=os.environ.get("MOLT_REGISTRY", "~/.molt/registry"))
    db_arg(tok)
    tok.add_argument("--publisher", default="default", help="who the token publishes as (mint)")
    tok.set_defaults(fn=cmd_token)

    sea = sub.add_parser("search", help="packages whose name, env IDs, description or tags match")
    sea.add_argument("query")
    registry_args(sea)
    sea.set_defaults(fn=cmd_search)

    ins = sub.add_parser("install", help="install the package providing an env ID (ns/name-vN[@version])")
    ins.add_argument("env_id")
    registry_args(ins)
    ins.add_argument("--python", help="the interpreter to install into (default: this one)")
    ins.add_argument(
        "--isolated",
        action="store_true",
        help="install into a venv of its own (its dependencies cannot clash with others'); make() serves it from there",
    )
    ins.set_defaults(fn=cmd_install)

    yan = sub.add_parser("yank", help="yank a package version (ns/name-vN@version); exact pins still install it")
    yan.add_argument("env_id")
    registry_args(yan)
    yan.add_argument("--reason", default="", help="shown to whoever installs it by pin")
    yan.set_defaults(fn=cmd_yank)

    eco = sub.add_parser("ecosystem", help="make the venv of its own an ecosystem's envs run in (verifiers)")
    eco.add_argument("action", choices=["install"])
    eco.add_argument("name", help="the ecosystem's ID scheme, e.g. verifiers")
    eco.add_argument(
        "--with",
        dest="packages",
        action="append",
        default=[],
        metavar="PKG",
        help="a package (requirement or path) to install into it too, e.g. a verifiers taskset package; repeatable",
    )
    eco.set_defaults(fn=cmd_ecosystem)

    sen = sub.add_parser(
        "serve-env", help="serve an installed env over the env protocol (HTTP + one WebSocket per episode)"
    )
    sen.add_argument("env_ids", nargs="+", metavar="ENV_ID", help="one ID (several with --protocol openenv)")
    sen.add_argument(
        "--protocol",
        choices=["molt-env/1", "openenv"],
        default="molt-env/1",
        help="molt-env/1: token-first, what molt-train uses; openenv: a genuine OpenEnv server (its clients, TRL, ...)",
    )
    sen.add_argument("--max-sessions", type=int, help="openenv: sessions at once (default 64); more: CAPACITY_REACHED")
    sen.add_argument(
        "--session-timeout", type=float, help="openenv: close a session idle this many seconds (default 600; 0: never)"
    )
    sen.add_argument("--python", help="serve it from this venv (a directory or its python); isolated installs: theirs")
    sen.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    sen.add_argument("--port", type=int, default=8100, help="port to listen on (0: a free one)")
    sen.add_argument(
        "--max-episodes", type=int, help="at most N episodes at once; more wait for a free slot (default: no limit)"
    )
    sen.add_argument("--exit-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)  # servers make() starts
    sen.set_defaults(fn=cmd_serve_env)

    from env_registry.evaluation import cli as eval_cli

    eval_cli.add_parser(sub)

    vie = sub.add_parser(
        "view",
        help="browse an eval's samples turn by turn in a local web page (127.0.0.1 only)",
        description="Serve the pages of a `molt-env eval --out DIR` directory on loopback: the run's summary and a "
        "table of its episodes (filter by ?reward=pass|fail|N, ?failure=REASON|none|any, ?min_len=/?max_len= "
        "completion tokens, ?env=), and each episode turn by turn (messages, tool calls and results, images, reward, "
        "info, failure, token counts). No script runs on the pages; model and tool output is shown as text.",
    )
    vie.add_argument("directory", metavar="DIR", help="an eval output directory (holds samples.jsonl)")
    vie.add_argument("--port", type=int, default=8200, help="port on 127.0.0.1 (default 8200; 0: a free one)")
    vie.set_defaults(fn=cmd_view)

    from env_registry.validation import cli as validation_cli

    validation_cli.add_parsers(sub, registry_args, db_arg)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.simplefilter("default")
    try:
        return args.fn(args)
    except Error as exc:
        print(f"molt-env {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in SERVER_EXTRA:
            raise
        print(
            f"molt-env {args.command}: needs {exc.name!r}; install it with pip install 'molt-ecosystem[server]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
