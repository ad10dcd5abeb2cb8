"""The ``textarena:`` scheme's source: TextArena's registry as IDs, their availability (a probe, cached), and the
spec of each (its kwargs checked)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from env_registry.ecosystems.adapter import Adapter
from env_registry.ecosystems.textarena.play import Table, unwrapped
from env_registry.errors import UnregisteredEnv
from env_registry.sources import CatalogEntry
from molt_envs.seats import MODES, RANDOM, check_policy

ENV_ENTRY = "env_registry.ecosystems.textarena.play:TextArenaEnv"
GAME_ENTRY = "env_registry.ecosystems.textarena.play:TextArenaGame"
GENERATOR = "env_registry.ecosystems.textarena.play:seed_rows"
SPLITS = {"train": {"size": 10_000, "seed": 0}, "test": {"size": 200, "seed": 1_000_000}}
VARIANTS = ("-train", "-raw")  # TextArena's copies of each ID with other observation wrappers
GAME_KWARGS = ("mode", "opponent", "seat_policies")  # a game's own (molt_envs.seats.Game), not TextArena's
MAX_PLAYERS = 15  # the probe tries player counts 1..MAX_PLAYERS
PROBE_FORMAT = 1  # bump when what a probe records changes
PROBE_TIMEOUT_S = 60.0  # per game
PROBE_BATCH_TIMEOUT_S = 900.0


# -- availability probe -----------------------------------------------------------------------------------------------


def _cache_path(version: str) -> Path:
    """Where the probe's results are kept: per TextArena version and Python version (some of its code needs 3.12)."""
    root = Path(os.environ.get("MOLT_CACHE") or "~/.molt/cache").expanduser()
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return root / "textarena" / f"probe-{version}-{python}-f{PROBE_FORMAT}.json"


def _no_network() -> None:
    """Make every outgoing connection of this process fail at once (the probe's "offline")."""
    import socket

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("the network is off: a TextArena env must run offline to be available")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]


def _reason(exc: BaseException, stage: str) -> str:
    """Why an env does not run, from what it raised at ``stage`` (make, reset, its first move)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, LookupError) and "nltk" in text.lower():
        found = re.search(r"Resource \S*?(\w+)\S* not found", text)
        return f"needs NLTK data{f' ({found[1]!r})' if found else ''}, which it downloads at run time"
    if "OPENROUTER" in text.upper():
        return "calls an LLM through OpenRouter (needs the network and OPENROUTER_API_KEY)"
    if "the network is off" in text:
        return f"needs the network at {stage}"
    if isinstance(exc, ModuleNotFoundError):
        if (exc.name or "").startswith("textarena."):
            return f"its module {exc.name} is not in the installed TextArena"
        return f"needs the module {exc.name!r}, which is not installed"
    if isinstance(exc, SyntaxError):
        where = f"{Path(exc.filename or '?').parent.name}/{Path(exc.filename or '?').name} line {exc.lineno}"
        return (
            f"its code does not compile under Python {sys.version_info[0]}.{sys.version_info[1]} ({exc.msg}, {where})"
        )
    if isinstance(exc, FileNotFoundError):
        return f"a file it reads is not in the installed TextArena ({Path(str(exc.filename or exc)).name})"
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"fails at {stage}: {first[:160]}"


def _probe_one(key: str) -> dict[str, Any]:
    """Make and reset ``key`` (a name, or ``name?{json kwargs}``) with every player count, then play one move: what
    the catalog and the spec need. ``single`` says, from the game's source, whether it is a one-player game (for
    the catalog of one that does not import)."""
    _no_network()
    import textarena as ta
    from textarena.envs.registration import ENV_REGISTRY

    name, _, raw = key.partition("?")
    kwargs = json.loads(raw) if raw else {}
    registered = ENV_REGISTRY[name]
    module, _, attr = str(registered.entry_point).partition(":")
    source = Path(ta.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    found: dict[str, Any] = {"single": "SinglePlayerState" in (source.read_text() if source.is_file() else "")}
    try:
        cls = registered.entry_point
        cls = getattr(importlib.import_module(module), attr) if isinstance(cls, str) else cls
    except Exception as exc:
        return {**found, "available": False, "reason": _reason(exc, "import")}
    found["params"] = params = {}
    for pname, param in inspect.signature(cls.__init__).parameters.items():
        if pname != "self" and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            default = registered.kwargs.get(pname, param.default)
            params[pname] = None if default in (inspect.Parameter.empty, None) else type(default).__name__
    doc = (cls.__doc__ or "").strip().splitlines()
    found["description"] = doc[0] if doc else ""
    try:
        env = ta.make(name, **kwargs)
    except Exception as exc:
        return {**found, "available": False, "reason": _reason(exc, "make")}
    players, errors, first = [], [], {}
    for n in range(1, 2 if found["single"] else MAX_PLAYERS + 1):  # a one-player game's state takes 1 only
        try:
            env.reset(num_players=n, seed=0)
            if unwrapped(env).state.num_players == n:
                players.append(n)
                first[n] = repr(unwrapped(env).get_observation())
        except Exception as exc:
            errors.append(_reason(exc, "reset"))
    if not players:
        common = Counter(errors).most_common(1)[0][0] if errors else f"no player count from 1 to {MAX_PLAYERS} works"
        return {**found, "available": False, "reason": common}
    default = players[0] if len(players) == 1 else min(p for p in players if p > 1)
    if not found["single"]:
        with contextlib.suppress(Exception):  # a game with a default count of its own (reset(num_players=None))
            env.reset(num_players=None, seed=0)
            default = n if (n := unwrapped(env).state.num_players) in players else default
    found.update(players=players, default_players=default, single=default == 1)
    stage = "reset"
    try:
        table = Table(name, kwargs, default)
        table.reset(0)
        deterministic = repr(table.inner.get_observation()) == first[default]  # another game of that seed: the same?
        stage = "its first move"
        table.step("[0]")
    except Exception as exc:
        return {**found, "available": False, "reason": _reason(exc, stage)}
    return {**found, "available": True, "reason": "", "deterministic": deterministic}


def _probe_main(names: list[str], workers: int) -> None:
    """The probe process: import TextArena once, fork one child per name (``workers`` at a time, each under
    ``PROBE_TIMEOUT_S``), print ``{name: result}`` as JSON."""
    import textarena  # noqa: F401  (imported once, before forking)

    results: dict[str, Any] = {}
    pending, running = list(names), {}  # pid -> (name, read fd, started)
    while pending or running:
        while pending and len(running) < workers:
            name = pending.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: quiet, offline, one game
                os.close(read)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                try:
                    result = _probe_one(name)
                except BaseException as exc:
                    result = {"available": False, "reason": _reason(exc, "make")}
                with os.fdopen(write, "w") as out:
                    out.write(json.dumps(result))
                os._exit(0)
            os.close(write)
            running[pid] = (name, read, time.monotonic())
        time.sleep(0.02)
        for pid, (name, read, started) in list(running.items()):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() - started < PROBE_TIMEOUT_S:
                continue
            if not done:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            with os.fdopen(read) as f:
                text = f.read()
            try:
                results[name] = json.loads(text)
            except ValueError:
                why = f"did not answer within {PROBE_TIMEOUT_S:.0f} s" if not done else "its probe process died"
                results[name] = {"available": False, "reason": f"making and resetting it {why}", "again": not done}
            del running[pid]
    print(json.dumps(results))


# -- the source -------------------------------------------------------------------------------------------------------


class TextArena(Adapter):
    """The ``textarena:`` scheme (module docstring)."""

    scheme = "textarena"
    library = "textarena"
    module = "textarena"
    extra = "textarena"
    license = "MIT"

    def names(self) -> list[str]:
        probes = self._read_cache(self.version())
        if probes is not None and "names" in probes:
            return list(probes["names"])
        from textarena.envs.registration import ENV_REGISTRY

        return sorted(
            i for i in ENV_REGISTRY if not any(i.endswith(v) and i[: -len(v)] in ENV_REGISTRY for v in VARIANTS)
        )

    def _read_cache(self, version: str) -> dict[str, Any] | None:
        try:
            return json.loads(_cache_path(version).read_text())
        except (OSError, ValueError):
            return None

    def probes(self, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """What the probe found of ``names`` (default: every name), probing those not in the cache yet."""
        version = self.version()
        cache = self._read_cache(version) or {}
        known = cache.get("envs", {})
        wanted = self.names() if names is None else names
        missing = [n for n in wanted if n not in known]
        if missing:
            found = self._probe(missing)
            known = {**((self._read_cache(version) or {}).get("envs", {})), **known, **found}  # another process's too
            kept = {k: v for k, v in known.items() if not v.get("again")}  # a timeout (a busy machine?): probe again
            cache = {"textarena": version, "names": self.names(), "envs": kept}
            path = _cache_path(version)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
            os.replace(tmp, path)
        return {n: known[n] for n in wanted}

    def _probe(self, names: list[str]) -> dict[str, dict[str, Any]]:
        workers = max(1, min(8, os.cpu_count() or 1, len(names)))
        command = [self.python(), "-m", "env_registry.ecosystems.textarena.source", "--probe", str(workers), *names]
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_BATCH_TIMEOUT_S)
        if done.returncode != 0:
            raise UnregisteredEnv(
                f"the TextArena availability probe failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )
        return json.loads(done.stdout.strip().splitlines()[-1])

    def catalog(self) -> list[CatalogEntry]:
        entries = []
        for name, probe in self.probes().items():
            kind = "env" if probe.get("single", True) else "game"
            entries.append(
                CatalogEntry(f"{self.scheme}:{name}", kind, probe["available"], probe["reason"], _describe(probe))
            )
        return entries

    def check_name(self, name: str) -> None:
        for variant in VARIANTS:
            if name.endswith(variant) and name[: -len(variant)] in self.names():
                raise UnregisteredEnv(
                    f"textarena:{name} is TextArena's {name[: -len(variant)]} with other observation wrappers; this "
                    f"scheme gives each turn's new game messages as a chat turn, so use "
                    f"textarena:{name[: -len(variant)]}"
                )
        super().check_name(name)

    def build(self, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        probe = self.probes([name])[name]
        if not probe["available"]:
            raise ValueError(f"TextArena's {name} is not available here: {probe['reason']}")
        params, ours = probe["params"], ("num_players", *GAME_KWARGS) if probe["default_players"] > 1 else ()
        for key, value in kwargs.items():
            if key not in params and key not in ours:
                raise ValueError(
                    f"TextArena's {name} takes no argument {key!r}; it takes: {', '.join([*params, *ours]) or 'none'}"
                )
            if key in params and params[key] is not None and not _fits(value, params[key]):
                raise ValueError(f"{key}={value!r} does not fit TextArena's {name}: its {key} is of type {params[key]}")
        env_kwargs = {k: v for k, v in kwargs.items() if k in params}
        if env_kwargs:  # made, reset and played once with them, in the probe's process
            key = f"{name}?{json.dumps(env_kwargs, sort_keys=True)}"
            probe = self.probes([key])[key]
            if not probe["available"]:
                raise ValueError(f"TextArena's {name} does not run with {env_kwargs}: {probe['reason']}")
        game = probe["default_players"] > 1
        own = {k: v for k, v in kwargs.items() if k in ours}
        players = own.setdefault("num_players", probe["default_players"]) if game else 1
        if players not in probe["players"]:
            raise ValueError(
                f"TextArena's {name} cannot be played by num_players={players!r}; it is for {_describe(probe)}"
            )
        if game:
            _check_seating(own, players)
        return {
            "entry_point": GAME_ENTRY if game else ENV_ENTRY,
            "kind": "game" if game else "env",
            "description": f"TextArena {name}: {_describe(probe)}. Scored by TextArena's own rules.",
            "tags": ["textarena", "multi-turn", "text", *(["multi-seat", "self-play"] if game else ["puzzle"])],
            "license": self.license,
            "reward_range": (-1.0, 1.0),
            "deterministic": bool(probe.get("deterministic")),
            "kwargs": {"textarena_id": name, **({"env_kwargs": env_kwargs} if env_kwargs else {}), **own},
            "datasets": {
                split: {
                    "generator": GENERATOR,
                    "kwargs": {**size_seed, **({"players": players, "vs_random": split == "test"} if game else {})},
                }
                for split, size_seed in SPLITS.items()
            },
            "card": {
                "source": f"TextArena {self.version()} (PyPI 'textarena'), {name}: each row is a reset seed",
                "license": "MIT",
                "held_out": "row i is the game reset with seed `seed + i`; train seeds start at 0, test seeds at "
                "1000000, so they do not overlap",
            },
        }


def _check_seating(own: dict[str, Any], players: int) -> None:
    """Refuse a ``mode``, ``opponent`` or ``seat_policies`` that ``molt_envs.seats.Game`` would refuse at make."""
    if own.get("mode", "self_play") not in MODES:
        raise ValueError(f"mode={own['mode']!r} is not one of {MODES}")
    check_policy(own.get("opponent", RANDOM), "opponent")
    seats = [f"player_{i}" for i in range(players)]
    for seat, policy in dict(own.get("seat_policies") or {}).items():
        if seat not in seats:
            raise ValueError(f"seat_policies names seat {seat!r}; this game's seats are {seats}")
        check_policy(policy, f"seat_policies[{seat!r}]")


def _fits(value: Any, expected: str) -> bool:
    kinds = {"int": int, "float": (int, float), "bool": bool, "str": str, "list": list, "dict": dict, "tuple": list}
    if expected not in kinds:
        return True  # a class or callable: TextArena checks it when the game is made
    return isinstance(value, kinds[expected]) and not (expected in ("int", "float") and isinstance(value, bool))


def _describe(probe: dict[str, Any]) -> str:
    players = probe.get("players") or []
    if not players:
        who = ""
    elif len(players) == 1:
        who = "1 player" if players[0] == 1 else f"{players[0]} players"
    elif players == list(range(players[0], players[-1] + 1)):
        who = f"{players[0]}-{players[-1]} players"
    else:
        who = f"{', '.join(map(str, players))} players"
    return "; ".join(p for p in (who, probe.get("description", "")) if p)


SOURCE = TextArena()

if __name__ == "__main__" and sys.argv[1:2] == ["--probe"]:
    _probe_main(sys.argv[3:], int(sys.argv[2]))
