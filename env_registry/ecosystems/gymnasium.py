"""Gymnasium and this registry, both ways: every molt ID as a ``gymnasium.Env`` (``import env_registry.gym`` registers
them all), and every Gymnasium env whose spaces read and write as text as ``gym:ENV_ID`` (``SOURCE``, below).

Molt IDs in Gymnasium:

::

    import gymnasium, env_registry.gym
    env = gymnasium.make("molt/arith-v1")                  # or, with no import at all:
    env = gymnasium.make("env_registry.gym:molt/arith-v1")  # Gymnasium's "module:ID" form
    obs, info = env.reset(seed=0)                           # the same seed picks the same task
    obs, reward, terminated, truncated, info = env.step("3+4=7")

Registration is lazy: it reads the registry's entry-point metadata and imports no env module; ``make`` does. The
version rules are Gymnasium's (the same as ``env_registry.make``): an unversioned ID resolves to the latest version.
A package pin is a keyword: ``gymnasium.make("molt/arith-v1", package_version="0.1.0")``. IDs registered with
``env_registry.register`` after the import join on ``register_all()``.

``MoltGymEnv`` is a real ``gymnasium.Env``: observation and action spaces are ``spaces.Text`` (any characters); the
observation is the text of the env's messages (``info["messages"]`` has them as chat messages, for a chat
template); a step's reward is the env's; multi-turn envs go on until ``terminated`` or ``truncated`` (the spec's
``max_turns``). A game (``kind = "game"``) is played from one seat against its default opponent. ChatAgent IDs
are registered too, so that ``make`` can say why they are not Gymnasium envs.

Gymnasium's envs here: ``gym:CartPole-v1``, ``gym:FrozenLake-v1?is_slippery=false`` (kwargs go to
``gymnasium.make``; ``max_episode_steps=N`` sets its time limit, ``reward_range=[lo,hi]`` the spec's, for pass@k). The
names are ``gymnasium.registry``'s; one is available when ``gymnasium.make`` makes it here (box2d, MuJoCo, jax, ...
installed) and both its spaces have a text form: ``Discrete``, ``MultiDiscrete``, ``MultiBinary``, a ``Box`` of at
most ``MAX_NUMBERS`` numbers, ``Text``, and a ``Tuple`` of those (an image observation has none). An episode is one
seeded reset (``molt_envs.bridges.GymnasiumEnv``, run in an env server of its own process): the model sees each
observation as text and answers with the action, the last number(s) of its reply (``parse_action``); a reply that
names no action in the space ends the episode as a counted ``invalid_action``. Each step's reward is Gymnasium's.
Making an env to read its spaces (``catalog``, resolving an ID) happens in the caller's process; episodes do not.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import re
import string
import threading
import warnings
from collections.abc import Coroutine
from typing import Any

from env_registry.datasets import load_split
from env_registry.ecosystems.adapter import Adapter
from env_registry.errors import NotAGymnasiumEnv
from env_registry.registry import registry
from env_registry.sources import CatalogEntry
from molt_envs.bridges import GymnasiumEnv, clean_action
from molt_envs.contract import Env, Result, SamplingParams
from molt_envs.seats import OneSeatEnv

try:  # the molt-IDs-in-Gymnasium classes subclass Gymnasium's; without it the gym: source still loads (and says why)
    import gymnasium
    from gymnasium import spaces

    _GymEnv, _Text = gymnasium.Env, spaces.Text
except ImportError:
    _GymEnv = _Text = object  # type: ignore[assignment,misc]

ENTRY_POINT = "env_registry.ecosystems.gymnasium:MoltGymEnv"
MAX_OBSERVATION_CHARS = 1 << 20
MAX_ACTION_CHARS = 4096
_ROWS: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}  # (spec hash, split, num_tasks) -> rows


class AnyText(_Text):  # type: ignore[misc,valid-type]
    """``spaces.Text`` of any characters (an LLM reads and writes all of Unicode), sampled from printable ASCII."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def register_all() -> list[str]:
    """Register every molt ID not yet in Gymnasium's registry; returns the IDs added."""
    import gymnasium

    added = []
    for env_id in registry:
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            env_id,
            entry_point=ENTRY_POINT,
            kwargs={"env_id": env_id},
            nondeterministic=not registry[env_id].deterministic,
        )
        added.append(env_id)
    return added


class MoltGymEnv(_GymEnv):  # type: ignore[misc,valid-type]
    """One molt env as a Gymnasium env (module docstring).

    Args:
        env_id: the molt ID (what ``gymnasium.make`` registered it under).
        split: the dataset split ``reset`` draws tasks from.
        render_mode: None or ``"ansi"`` (the episode's transcript as text).
        package_version: pin the providing package's version, as ``ns/name-vN@version`` does.
        num_tasks: draw tasks from the split's first ``num_tasks`` rows only (default: every row).
        **env_kwargs: the env's own kwargs (e.g. ``difficulty=2``), overlaying the spec's.

    Raises:
        NotAGymnasiumEnv: for a ChatAgent ID.
        env_registry.Error: an unknown ID or a pin that does not match the installed package.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        env_id: str,
        split: str = "train",
        render_mode: str | None = None,
        package_version: str | None = None,
        num_tasks: int | None = None,
        **env_kwargs: Any,
    ) -> None:
        spec = registry.spec(f"{env_id}@{package_version}" if package_version else env_id)
        if spec.kind == "chat_agent":
            raise NotAGymnasiumEnv(
                f"{spec.id!r} is a ChatAgent: it runs its own loop and calls the policy through an OpenAI/Anthropic "
                "client, so there is no step(action) for Gymnasium to drive. Run it with "
                f"env_registry.runner_for({spec.id!r}) (a ChatAgentRunner over a model engine), `molt-train rl "
                f"--env {spec.id}` or `molt-train eval --env {spec.id}`; for Gymnasium pick an env of kind 'env' "
                "or 'game' (`molt-env list`)"
            )
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode {render_mode!r} is not supported; use None or 'ansi'")
        self.render_mode, self.split = render_mode, split
        self.molt_spec, self._factory = registry.factory(spec.id, **env_kwargs)
        _run(self._new_env().close())  # bad kwargs (a parser that does not import, ...) fail here, at make
        key = (self.molt_spec.hash, split, num_tasks)
        if key not in _ROWS:
            _ROWS[key] = load_split(self.molt_spec, split, num_tasks)
        self._rows = _ROWS[key]
        if not self._rows:
            raise ValueError(f"split {split!r} of {spec.id!r} has no rows to draw tasks from")
        printable = string.printable
        self.observation_space = AnyText(MAX_OBSERVATION_CHARS, min_length=0, charset=printable)
        self.action_space = AnyText(MAX_ACTION_CHARS, min_length=0, charset=printable)
        self._env: Env | None = None
        self._transcript: list[str] = []

    def _new_env(self) -> Env:
        env = self._factory()
        return OneSeatEnv(env) if self.molt_spec.kind == "game" else env

    # -- episode --
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on a task drawn by the seed (``options={"index": i}`` picks row ``i``)."""
        super().reset(seed=seed)
        self._end_episode()
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self._rows)))
        row = self._rows[index]
        self._env = self._new_env()
        self._label, self._turn, self._done = row["label"], 0, False
        start = _run(self._env.reset({"observation": row["prompt"], "label": row["label"], "images": []}))
        observation = start["observation"]
        text = _text(observation)
        self._context, self._transcript = text, [text]
        info = {"index": index, "messages": _messages(observation), "env_id": self.molt_spec.id}
        return text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn: ``action`` is the model's reply. After the episode ended it returns ``("", 0.0, True, ...)``."""
        if self._done or self._env is None:
            return "", 0.0, True, False, {}
        self._context += action
        self._transcript.append(action)
        result: Result = _run(
            self._env.step(
                {
                    "observation_text": self._context,
                    "action_text": action,
                    "label": self._label,
                    "sampling_params": SamplingParams(),
                    "turn": self._turn,
                    "images": [],
                }
            )
        )
        self._turn += 1
        terminated = bool(result.terminated)
        max_turns = self.molt_spec.max_turns
        truncated = bool(result.truncated) or (not terminated and max_turns is not None and self._turn >= max_turns)
        text = "" if terminated or truncated else _text(result.observation)
        self._context += text
        self._transcript.append(text)
        info = {**copy.deepcopy(result.info), "messages": _messages(result.observation)}
        if terminated or truncated:
            self._end_episode()
            self._done = True
        return text, float(result.reward), terminated, truncated, info

    def render(self) -> str | None:
        """``"ansi"``: the episode so far, observations and actions in turn."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(self._transcript)

    def close(self) -> None:
        """Ends the episode in progress (an env's ``close`` releases its sandboxes); safe to call twice."""
        self._end_episode()

    def _end_episode(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            _run(env.close())


def _text(observation: str | list[dict[str, Any]]) -> str:
    if isinstance(observation, str):
        return observation
    return "\n\n".join(str(m.get("content", "")) for m in observation)


def _messages(observation: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}] if observation else []
    return copy.deepcopy(observation)


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run an env coroutine to completion from synchronous Gymnasium code, on one event loop thread kept for the
    process (so sandboxes and tools keep their loop across steps, and callers inside a running loop work too)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="molt-gym-loop", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _LOOP).result()


# -- Gymnasium's envs as gym:ENV_ID ------------------------------------------------------------------------------------

TEXT_ENV = "env_registry.ecosystems.gymnasium:GymTextEnv"
SEED_SPLIT = "molt_envs.envs.toy_text:seed_split"  # rows are episode seeds, as in the catalog's gym/... IDs
MAX_NUMBERS = 64  # a Box (or MultiDiscrete, MultiBinary) of more numbers has no text form here (an image, say)
UNLIMITED_TURNS = 200  # max_turns of an env without a time limit (max_episode_steps=N sets one)
OUR_KWARGS = ("reward_range",)  # the spec's; every other kwarg goes to gymnasium.make
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class GymnasiumSource(Adapter):
    """``gym:ENV_ID``: every env of ``gymnasium.registry`` (the module docstring says which are available)."""

    scheme = "gym"
    library = "gymnasium"
    module = "gymnasium"
    extra = "gymnasium"
    license = "MIT"

    def names(self) -> list[str]:
        self.version()
        import gymnasium

        return sorted(name for name, spec in gymnasium.registry.items() if spec.entry_point != ENTRY_POINT)

    def catalog(self) -> list[CatalogEntry]:
        entries = []
        for name in self.names():
            try:
                made = _probe(name, {})
            except ValueError as exc:
                entries.append(CatalogEntry(f"gym:{name}", "env", False, str(exc)))
                continue
            entries.append(CatalogEntry(f"gym:{name}", "env", True, "", made["description"]))
        return entries

    def build(self, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        make_kwargs = {k: v for k, v in kwargs.items() if k not in OUR_KWARGS}
        made = _probe(name, make_kwargs)
        reward_range = kwargs.get("reward_range", made["reward_range"])
        if not (
            isinstance(reward_range, list | tuple)
            and len(reward_range) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in reward_range)
        ):
            raise ValueError(f"reward_range must be a list of two numbers [low, high], got {reward_range!r}")
        return {
            "entry_point": TEXT_ENV,
            "kind": "env",
            "description": made["description"],
            "tags": ["gymnasium", "multi-turn", "text"],
            "license": self.license,
            "reward_range": tuple(reward_range),
            "max_turns": made["max_episode_steps"] or UNLIMITED_TURNS,
            "deterministic": made["deterministic"],
            "kwargs": {"gym_id": name, **({"make_kwargs": make_kwargs} if make_kwargs else {})},
            "datasets": {
                "train": {"generator": SEED_SPLIT, "kwargs": {"size": 5000, "seed": 0, "name": name}},
                "test": {"generator": SEED_SPLIT, "kwargs": {"size": 200, "seed": 1_000_000, "name": name}},
            },
            "card": {
                "source": f"Gymnasium {name} (PyPI 'gymnasium' {self.version()}), one episode per seeded reset",
                "license": self.license,
                "held_out": "each row is an episode seed; the train and test seed ranges do not overlap",
            },
        }


SOURCE = GymnasiumSource()


def _probe(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Make ``name`` with ``kwargs`` and read what the spec needs from it.

    Raises:
        ValueError: a kwarg the env does not take (or of the wrong type), an env that cannot be made here (a missing
            dependency), or a space with no text form; the message names it.
    """
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    gym_spec = gymnasium.registry[name]
    if "render_mode" in kwargs:
        raise ValueError("the gym: scheme plays an env as text: render_mode is not a kwarg here")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Gymnasium warns of old versions, deprecated envs, ...
        try:
            entry = gym_spec.entry_point
            problem = _bad_kwarg(name, load_env_creator(entry), kwargs) if isinstance(entry, str) else None
            env = None if problem else gymnasium.make(name, **kwargs)
        except Exception as exc:  # a missing dependency (DependencyNotInstalled, ImportError), a bad value, ...
            raise ValueError(f"gymnasium.make({name!r}) fails here: {type(exc).__name__}: {exc}") from None
    if env is None:
        raise ValueError(problem)
    try:
        observation = _describe(env.observation_space, "observation")
        action = _describe(env.action_space, "action")
        own_range = getattr(env.unwrapped, "reward_range", None)
    finally:
        env.close()
    steps = env.spec.max_episode_steps if env.spec is not None else None
    if own_range is None or not all(math.isfinite(x) for x in own_range):
        own_range = (-1e9, 1e9)  # unknown to Gymnasium: give reward_range=[lo,hi] where pass@k should mean something
    return {
        "description": f"Gymnasium {name}: observation {observation}; action {action}; Gymnasium's reward each step.",
        "max_episode_steps": steps,
        "reward_range": tuple(float(x) for x in own_range),
        "deterministic": not gym_spec.nondeterministic,
    }


def _bad_kwarg(name: str, creator: Any, kwargs: dict[str, Any]) -> str | None:
    """What is wrong with ``kwargs`` (None: nothing): each is ``gymnasium.make``'s own or a parameter of the env's
    constructor, of the type it annotates."""
    try:
        params = dict(inspect.signature(creator).parameters)
    except (TypeError, ValueError):  # a builtin: its parameters cannot be read, so make() judges
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    takes = {"max_episode_steps": "int"} | {
        k: p.annotation
        for k, p in params.items()
        if k not in ("self", "render_mode") and p.kind is not p.VAR_POSITIONAL
    }
    for key, value in kwargs.items():
        if key not in takes:
            return f"Gymnasium's {name} takes no kwarg {key!r}; it takes {', '.join(sorted(takes))}"
        expected = takes[key] if isinstance(takes[key], str) else getattr(takes[key], "__name__", "")
        fits = {
            "bool": lambda v: isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
        }.get(expected.replace(" | None", ""), lambda v: True)
        if not fits(value) and not (value is None and "None" in expected):
            return f"Gymnasium's {name} takes {key}: {expected}, got {value!r}"
    return None


# -- spaces as text ------------------------------------------------------------------------------------------------


def _size(space: Any) -> int:
    """How many numbers a numeric space's value has (a Tuple: its parts' together)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return 1
    if isinstance(space, spaces.Tuple):
        return sum(_size(part) for part in space.spaces)
    return math.prod(space.shape)


def _describe(space: Any, role: str) -> str:
    """A space in words, for the instructions and the catalog; ``ValueError`` (why) where it has no text form."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return f"an integer from {int(space.start)} to {int(space.start + space.n - 1)}"
    if isinstance(space, spaces.Text):
        if role == "action":
            return f"text of {space.min_length} to {space.max_length} characters (your whole reply)"
        return "text"
    if isinstance(space, spaces.Tuple):
        if role == "action" and any(isinstance(part, spaces.Text) for part in space.spaces):
            raise ValueError(f"its action space {space} mixes text and numbers, which one reply cannot be parsed into")
        return "in order: " + "; ".join(_describe(part, role) for part in space.spaces)
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        if _size(space) > MAX_NUMBERS:
            raise ValueError(
                f"its {role} space {space} has {_size(space)} numbers, too many to read as text (at most {MAX_NUMBERS})"
            )
        k, plural = _size(space), "s" if _size(space) != 1 else ""
        if isinstance(space, spaces.MultiBinary):
            return f"{k} integer{plural}, each 0 or 1"
        if isinstance(space, spaces.MultiDiscrete):
            return f"{k} integer{plural}, the i-th from 0 to n_i - 1 for n = {space.nvec.flatten().tolist()}"
        low, high = space.low.flatten(), space.high.flatten()
        kind = ("integer" if space.dtype.kind in "iu" else "number") + plural
        if (low == low[0]).all() and (high == high[0]).all():
            return f"{k} {kind}, each from {_number(low[0])} to {_number(high[0])}"
        bounds = ", ".join(f"[{_number(lo)}, {_number(hi)}]" for lo, hi in zip(low, high, strict=True))
        return f"{k} {kind}, in {bounds}"
    raise ValueError(f"its {role} space {space} has no text form here (a {type(space).__name__} space)")


def _number(x: Any) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else f"{x:.4g}"


def format_value(space: Any, value: Any) -> str:
    """A value of ``space`` as the model sees it: an integer, numbers in brackets (4 significant digits), text."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return str(int(value))
    if isinstance(space, spaces.Text):
        return str(value)
    if isinstance(space, spaces.Tuple):
        return "(" + ", ".join(format_value(part, v) for part, v in zip(space.spaces, value, strict=True)) + ")"
    import numpy as np

    def nested(array: Any) -> str:
        return "[" + ", ".join(nested(a) for a in array) + "]" if array.ndim else _number(array)

    return nested(np.asarray(value))


def parse_action(space: Any, text: str) -> Any:
    """The action a reply names: its last number(s), as many as the space has (a ``Text`` space: the whole reply).

    Raises:
        ValueError: too few numbers, a fraction where an integer belongs, or a value outside the space.
    """
    from gymnasium import spaces

    text = clean_action(text)
    if isinstance(space, spaces.Text):
        action = text
    else:
        found = _NUMBER.findall(text)
        if len(found) < _size(space):
            raise ValueError(f"the reply names {len(found)} number(s), the action needs {_size(space)}: {text[-80:]!r}")
        action = _from_numbers(space, [float(x) for x in found[len(found) - _size(space) :]])
    if not space.contains(action):
        raise ValueError(
            f"{format_value(space, action) if not isinstance(action, str) else action!r} is not in {space}"
        )
    return action


def _from_numbers(space: Any, numbers: list[float]) -> Any:
    import numpy as np
    from gymnasium import spaces

    if isinstance(space, spaces.Tuple):
        parts, at = [], 0
        for part in space.spaces:
            parts.append(_from_numbers(part, numbers[at : at + _size(part)]))
            at += _size(part)
        return tuple(parts)
    integral = not isinstance(space, spaces.Box) or space.dtype.kind in "iu"
    if integral and not all(x.is_integer() for x in numbers):
        raise ValueError(f"{numbers} are not all integers, which {space} needs")
    if isinstance(space, spaces.Discrete):
        return np.int64(int(numbers[0]))
    return np.asarray(numbers, dtype=space.dtype).reshape(space.shape)


class GymTextEnv(GymnasiumEnv):
    """A ``gym:ENV_ID`` episode: ``GymnasiumEnv`` with its observation text, action parser and instructions taken from
    the env's spaces (``format_value``, ``parse_action``).

    Args:
        gym_id: the Gymnasium ID. make_kwargs: keyword arguments of ``gymnasium.make``.
        invalid_reward: the reward of a reply that names no action in the space (it ends the episode).
    """

    def __init__(self, gym_id: str, make_kwargs: dict[str, Any] | None = None, invalid_reward: float = 0.0) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(gym_id, make_kwargs, invalid_reward=invalid_reward)
        observation_space, action_space = self.env.observation_space, self.env.action_space
        self.parse_action = lambda text: parse_action(action_space, text)
        self.format_observation = lambda observation, env: (
            f"Observation: {format_value(observation_space, observation)}"
        )
        k = 0 if isinstance(action_space, spaces.Text) else _size(action_space)
        last = {0: "your whole reply is the action", 1: "the last number of your reply is the action"}.get(
            k, f"the last {k} numbers of your reply are the action"
        )
        self.instructions = (
            f"You act in the Gymnasium environment {gym_id}. Each turn you see an observation: "
            f"{_describe(observation_space, 'observation')}. Reply with an action: {_describe(action_space, 'action')}"
            f"; think first if you like: {last}. Each step earns Gymnasium's reward, until the episode ends."
        )
