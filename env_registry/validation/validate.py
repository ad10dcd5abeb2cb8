"""``validate(target)``: is this env package sound? A report with one verdict per check, never an exception for a
broken package.

1. The target becomes one wheel: a source directory is built (``molt-env build``; its build backend runs here, as
   for any build of your own tree), a ``.whl`` is taken as is, an env ID is resolved in a registry and its wheel
   downloaded and checked against the registry's sha256.
2. The wheel's manifests and entry points are read from its metadata (nothing is imported).
3. A fresh venv (of the jail's interpreter) gets the wheel and its declared dependencies with pip, binary wheels
   only (no dependency's build runs here), plus this framework (built from its source tree; pydantic etc. from the
   index; fastapi/uvicorn/httpx for ChatAgents' session server). Nothing in the venv is ever run on this host.
4. ``worker`` runs every check of ``checks`` inside the ``sandboxes`` local jail: bubblewrap namespaces, seccomp,
   Landlock, rlimits and a cgroup; no network (a ChatAgent package: a loopback device of the jail's own, where its
   session server listens); the host read-only; the venv mounted read-only; a wall-clock limit.
   A package that hangs, forks without end, writes outside its directory or crashes the interpreter is contained
   there and reported: the checks finished before it went wrong, and the step it was in.

5. With a ``reference`` policy (the operator's, ``calibration``): the worker then plays each env whose checks all
   passed with it, in the same jail (``evaluate``, ``molt-env eval``'s loop), and ``report.calibration`` holds pass@k,
   the mean reward, a reward histogram and the cost per episode. The jail's network namespace stays its own: the
   endpoint is reached through a unix socket bound into it, which the host pipes to the endpoint only.

A hostile package can still make its own checks pass (it runs in the worker's process); validation finds broken
packages and contains hostile ones, it does not prove a package benign.
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import importlib.metadata as metadata
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from env_registry.errors import Error
from env_registry.packages.artifacts import file_sha256, inspect_wheel
from env_registry.validation.calibration import JAIL_SOCKET_DIR, SOCKET_NAME, Reference, host_side
from env_registry.validation.jail import JAIL_PYTHON, run_worker
from env_registry.validation.report import ValidationReport

PIP_TIMEOUT_S = 900
FRAMEWORK = "molt-ecosystem"
FRAMEWORK_PACKAGES = ("env_registry", "molt_envs", "sandboxes", "molt_train")
CHAT_DEPENDENCIES = ("fastapi", "uvicorn", "httpx", "jinja2")  # the session server a ChatAgent is checked through
REFERENCE_DEPENDENCIES = ("openai", "httpx")  # the reference eval's EndpointPolicy


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def validate(
    target: str | Path,
    *,
    registry: str | None = None,
    token: str | None = None,
    timeout_s: float = 600.0,
    memory_mb: int = 2048,
    reference: Reference | None = None,
) -> ValidationReport:
    """Validate an env package: a source directory, a wheel file, or an env ID (``ns/name-vN[@version]``).

    Args:
        target: what to validate.
        registry: where an env ID is resolved (a directory or URL; default ``$MOLT_REGISTRY``).
        token: the registry token, for private registries.
        timeout_s: wall-clock limit of the jailed checks (a package that hangs fails at this point).
        memory_mb: memory limit of the jailed checks.
        reference: the reference policy of the difficulty calibration (``calibration``): each env whose checks all
            passed is then played by it in the jail, and ``report.calibration`` holds its figures.

    Returns:
        The report; ``report.ok`` says whether every check passed, ``report.to_json()`` is its stored form.
    """
    report = ValidationReport(target=str(target), started=now())
    with tempfile.TemporaryDirectory(prefix="molt-validate-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the jail's unprivileged uid reads the venv from here
        wheel = _wheel_of(str(target), registry, token, work, report)
        if wheel is not None:
            kinds = _read_wheel(wheel, report)
            if kinds is not None:
                site = _install(wheel, "chat_agent" in kinds, work, report, reference is not None)
                if site is not None:
                    _run_jailed(site, "chat_agent" in kinds, report, timeout_s, memory_mb, reference)
    report.finished = now()
    return report


def _wheel_of(
    target: str, registry: str | None, token: str | None, work: Path, report: ValidationReport
) -> Path | None:
    path = Path(target).expanduser()
    try:
        if path.is_dir():
            from env_registry.packages.build import build

            release = build(path, work / "dist")
            report.add("build", True, f"{release.wheel.name} from {path}")
            return release.wheel
        if path.suffix == ".whl":
            if not path.is_file():
                raise Error(f"{target} does not exist")
            return path
        if path.exists():
            raise Error(f"{target} is neither a package directory (with pyproject.toml) nor a .whl file")
        return _download(target, registry, token, work, report)
    except Error as exc:
        report.add("obtain the package", False, str(exc))
        return None


def _download(env_id: str, registry: str | None, token: str | None, work: Path, report: ValidationReport) -> Path:
    from env_registry.store.client import open_registry

    source = open_registry(registry, token)
    info = source.resolve(env_id)
    (work / "download").mkdir()
    wheel = source.fetch(info, info.wheel, work / "download")
    actual = file_sha256(wheel)
    if actual != info.wheel.sha256:
        raise Error(f"{wheel.name} from {source} has sha256 {actual}, but the index lists {info.wheel.sha256}")
    report.add("download", True, f"{wheel.name} from {source}, sha256 verified")
    return wheel


def _read_wheel(wheel: Path, report: ValidationReport) -> set[str] | None:
    try:
        name, version, manifests = inspect_wheel(wheel)
    except Error as exc:
        report.add("manifest", False, str(exc))
        return None
    report.package, report.version = name, version
    report.env_ids = [m.id for m in manifests]
    report.add("manifest", True, f"{name} {version} declares {', '.join(report.env_ids)}")
    return {m.kind for m in manifests}


def _install(wheel: Path, chat: bool, work: Path, report: ValidationReport, calibrate: bool = False) -> Path | None:
    """A fresh venv holding the wheel, its declared dependencies and the framework; returns its site-packages."""
    try:
        framework = framework_wheel()
    except Error as exc:
        report.add("install into a fresh venv", False, str(exc))
        return None
    venv = work / "venv"
    proc = subprocess.run(
        [JAIL_PYTHON, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        report.add("install into a fresh venv", False, f"{JAIL_PYTHON} -m venv failed: {proc.stderr.strip()[-500:]}")
        return None
    wanted = (CHAT_DEPENDENCIES if chat else ()) + (REFERENCE_DEPENDENCIES if calibrate else ())
    extras = [f"{name}=={metadata.version(name)}" for name in dict.fromkeys(wanted)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--no-compile",
        "--only-binary=:all:",
        f"{FRAMEWORK} @ {framework.as_uri()}",
        str(wheel),
        *extras,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        report.add("install into a fresh venv", False, f"pip took longer than {PIP_TIMEOUT_S} s")
        return None
    if proc.returncode != 0:
        tail = [line for line in (proc.stdout + proc.stderr).splitlines() if "Location 'file:" not in line][-15:]
        report.add("install into a fresh venv", False, "pip install failed:\n" + "\n".join(tail))
        return None
    site = next((venv / "lib").glob("python3*/site-packages"))
    installed = sorted(p.name.split("-")[0] for p in site.glob("*.dist-info"))
    report.add("install into a fresh venv", True, f"{len(installed)} distributions: {', '.join(installed)}")
    return site


def _run_jailed(
    site: Path, chat: bool, report: ValidationReport, timeout_s: float, memory_mb: int, reference: Reference | None
) -> None:
    nonce = secrets.token_hex(16)
    given: dict = {"nonce": nonce, "env_ids": report.env_ids, "package": report.package}
    if reference is not None:
        given["reference"] = {**reference.to_json(), "socket": f"{JAIL_SOCKET_DIR}/{SOCKET_NAME}"}
    with host_side(reference) as forwarder:
        binds = ((forwarder.directory, JAIL_SOCKET_DIR),) if forwarder is not None else ()
        result = run_worker(site, json.dumps(given), timeout_s, memory_mb, chat or reference is not None, binds)
    if result["status"] == "unavailable":
        report.isolation = "none available"
        report.add(
            "isolation", False, f"the local jail is unavailable, so nothing of the package ran: {result['detail']}"
        )
        return
    network = "a loopback device of its own, nothing else" if chat else "no network"
    if reference is not None:
        network = "a loopback device of its own, and a unix socket piped to the reference endpoint only"
    report.isolation = (
        f"sandboxes {result.get('provider', 'local')} jail: bubblewrap namespaces, seccomp, Landlock, rlimits, "
        f"cgroup; {network}; host read-only; the venv read-only; {timeout_s:g} s wall, {memory_mb} MB"
    )
    done, step = _read_events(result["stdout"], nonce, report)
    if not done:
        what = {
            "timeout": f"did not finish within {timeout_s:g} s (a hang?)",
            "oom": f"ran out of its {memory_mb} MB",
            "cpu_limit": "ran out of CPU time",
            "output_limit": "printed more than the output limit",
        }.get(result["status"], f"ended with status {result['status']!r}, exit code {result.get('exit_code')}")
        tail = result["stderr"].strip()[-1500:]
        report.add("checks ran to the end", False, f"the jailed checks {what} during: {step or 'start-up'}\n{tail}")


def _read_events(stdout: str, nonce: str, report: ValidationReport) -> tuple[bool, str | None]:
    done, step = False, None
    for line in stdout.splitlines():
        if not line.startswith(nonce + " "):
            continue
        try:
            event = json.loads(line[len(nonce) + 1 :])
        except ValueError:
            continue
        if "check" in event:
            c = event["check"]
            report.add(str(c.get("name")), bool(c.get("passed")), str(c.get("detail", "")), c.get("env_id"))
        elif "step" in event:
            step = str(event["step"])
        elif isinstance(event.get("samples"), dict):
            given = event["samples"]
            report.add_samples(given.get("env_id"), given.get("split"), given.get("prompts"))
        elif isinstance(event.get("calibration"), dict):
            report.add_calibration(event["calibration"].get("env_id"), event["calibration"].get("figures"))
        elif event.get("done"):
            done = True
    return done, step


_FRAMEWORK_WHEELS: dict[str, Path] = {}


def framework_wheel() -> Path:
    """A wheel of this very framework, built from its source tree with hatchling (cached by content).

    Raises:
        Error: the framework was not installed from a source tree (nothing to build the venv's copy from).
    """
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    try:
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        name = None
    if name != FRAMEWORK:
        raise Error(
            f"validation installs {FRAMEWORK} from its source tree, which is not at {root}; install it from one"
        )
    digest = hashlib.sha256()
    for package in FRAMEWORK_PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                stat = path.stat()
                digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    digest.update(pyproject.read_bytes())
    key = digest.hexdigest()[:16]
    cached = _FRAMEWORK_WHEELS.get(key)
    if cached is not None and cached.is_file():
        return cached
    from hatchling.builders.wheel import WheelBuilder

    out = Path(tempfile.mkdtemp(prefix=f"molt-framework-{key}-"))
    atexit.register(shutil.rmtree, out, True)
    built = Path(next(WheelBuilder(str(root)).build(directory=str(out), versions=["standard"])))
    _FRAMEWORK_WHEELS[key] = built
    return built
