"""Games with several seats per episode: the ``Game`` contract, its one-seat ``Env`` view, and ``SeatRunner``.

A ``Game`` (e.g. ``molt_envs.bridges.PettingZooGame``) says whose turn it is, what that seat sees, and applies the
seat's move. Who plays a seat is a policy name:

- ``"model"``: the policy being trained or evaluated; its turns become that seat's ``Trajectory``;
- ``"random"``: a uniformly random legal action;
- ``"pkg.mod:fn"``: a scripted player, ``fn(observation, agent, env, rng) -> action``;
- ``"checkpoint:PATH"``: a frozen checkpoint, generating in a token context of its own (not trained); the runner
  gets its engine from ``SeatRunner.engines`` or asks the host through ``SeatRunner.engine_loader``.

``mode="self_play"`` maps every seat to ``"model"``; ``mode="vs"`` maps one seat (``model_seat``; by default it
alternates with the episode seed) to ``"model"`` and the others to ``opponent``; ``seat_policies`` then overrides
seats by name. A dataset label (a dict) may carry ``seed``, ``mode``, ``opponent``, ``model_seat`` and
``seat_policies`` for its episode: that is how a ``vs random`` eval split lives next to a self-play train split.

``SeatRunner`` keeps one token context per model seat (token-exact, as ``StepEnvRunner``) and returns one
``Trajectory`` per model seat that moved (one forfeiting on the first move leaves the other nothing to learn
from), each with the seat's own reward, ``seat`` and ``info["seat"]``. A failure anywhere
fails every seat of the game, so the trainer drops the game whole (a zero-sum game stays zero-sum in the batch).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from molt_envs.contract import Env, Result, SamplingParams, StepState
from molt_envs.engine import Engine
from molt_envs.runners import Runner, _decode, _encode, failure_reason, render_prompt, render_turn, tokenizer_work
from molt_envs.scripted import load_callable, random_legal_action, seed_from
from molt_envs.trajectory import Trajectory

MODES = ("self_play", "vs")
MODEL, RANDOM, CHECKPOINT = "model", "random", "checkpoint:"


def check_policy(policy: Any, what: str) -> str:
    """A policy name as the module docstring lists them; raises ``ValueError`` naming ``what`` otherwise."""
    ok = isinstance(policy, str) and (
        policy in (MODEL, RANDOM)
        or (policy.startswith(CHECKPOINT) and len(policy) > len(CHECKPOINT))
        or (":" in policy and not policy.startswith(CHECKPOINT))
    )
    if not ok:
        raise ValueError(
            f"{what} {policy!r} is not a policy; use 'model', 'random', a scripted 'package.module:function' "
            "or 'checkpoint:/path/to/hf-checkpoint'"
        )
    return policy


class Game(ABC):
    """A turn-based game with named seats; the runner drives it (see the module docstring).

    Args:
        seats: the seat names, in their turn order at the start.
        mode: ``"self_play"`` or ``"vs"``.
        opponent: the policy of the non-model seats in ``vs`` mode (and in the one-seat view).
        seat_policies: seat name -> policy, overriding the mode.
    """

    spec: Any = None  # the registry stamps the EnvSpec it was made from

    def __init__(
        self,
        seats: list[str],
        *,
        mode: str = "self_play",
        opponent: str = RANDOM,
        seat_policies: dict[str, str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self.seats, self.mode = list(seats), mode
        self.opponent = check_policy(opponent, "opponent")
        self.seat_policies = self._checked_seats(seat_policies or {})
        for policy in (self.opponent, *self.seat_policies.values()):
            scripted_or_none(self, policy)  # a scripted player that does not import fails here, at make

    def _checked_seats(self, seat_policies: dict[str, str]) -> dict[str, str]:
        for seat, policy in seat_policies.items():
            if seat not in self.seats:
                raise ValueError(f"seat_policies names seat {seat!r}; this game's seats are {self.seats}")
            check_policy(policy, f"seat_policies[{seat!r}]")
        return dict(seat_policies)

    def policies(self, label: Any = None) -> dict[str, str]:
        """Seat -> policy for one episode: the game's settings, overridden by a dict label's."""
        over = label if isinstance(label, dict) else {}
        mode = over.get("mode", self.mode)
        if mode not in MODES:
            raise ValueError(f"label mode {mode!r} is not one of {MODES}")
        if mode == "self_play":
            policies = dict.fromkeys(self.seats, MODEL)
        else:
            opponent = check_policy(over.get("opponent", self.opponent), "label opponent")
            model_seat = over.get("model_seat")
            if model_seat is None:
                model_seat = self.seats[(over.get("seed") or 0) % len(self.seats)]
            elif isinstance(model_seat, int):
                model_seat = self.seats[model_seat % len(self.seats)]
            if model_seat not in self.seats:
                raise ValueError(f"label model_seat {model_seat!r} is not one of the seats {self.seats}")
            policies = {seat: MODEL if seat == model_seat else opponent for seat in self.seats}
        policies.update(self.seat_policies)
        policies.update(self._checked_seats(over.get("seat_policies", {})))
        return policies

    @abstractmethod
    def reset(self, seed: int | None) -> None:
        """Start a new game (same seed, same game)."""

    @abstractmethod
    def to_move(self) -> str | None:
        """The seat whose turn it is, or None when the game is over."""

    @abstractmethod
    def observe(self, seat: str, first: bool) -> list[dict[str, Any]]:
        """Chat messages for the seat's turn (with its instructions when ``first``)."""

    @abstractmethod
    def play_text(self, seat: str, text: str) -> bool:
        """Apply a model's move; an unparsable or illegal one is a counted outcome that ends the game (False)."""

    @abstractmethod
    def play_policy(self, seat: str, policy: Callable[..., Any], rng: random.Random) -> bool:
        """Apply ``policy(observation, agent, env, rng)``'s move (an illegal one ends the game too)."""

    @abstractmethod
    def returns(self) -> dict[str, float]:
        """Each seat's total reward so far."""

    @abstractmethod
    def info(self, seat: str) -> dict[str, float]:
        """Scalar outcome counters of a seat (illegal moves, win, draw, ...)."""

    def close(self) -> None:
        return None

    def scripted(self, policy: str) -> Callable[..., Any]:
        """The callable of a ``"random"`` or ``"pkg.mod:fn"`` policy."""
        return random_legal_action if policy == RANDOM else load_callable(policy, None, "scripted policy")


def scripted_or_none(game: Game, policy: str) -> Callable[..., Any] | None:
    return None if policy == MODEL or policy.startswith(CHECKPOINT) else game.scripted(policy)


class OneSeatEnv(Env):
    """A game as a one-seat ``Env``: the model plays ``model_seat`` (from the label, else the first seat); every
    other seat plays its scripted policy, or the game's default opponent where a model or checkpoint would.

    What Gymnasium, ``molt-env check`` and ``StepEnvRunner`` see of a game. The reward of a turn is what the
    seat earned since its previous turn; ``info`` holds the game's scalar counters for the seat.
    """

    def __init__(self, game: Game) -> None:
        self.game, self.spec = game, game.spec

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        label = state.get("label")
        seed = seed_from(label)
        model_seat = label.get("model_seat") if isinstance(label, dict) else None
        if isinstance(model_seat, int):
            model_seat = self.game.seats[model_seat % len(self.game.seats)]
        self.seat = model_seat or self.game.seats[0]
        if self.seat not in self.game.seats:
            raise ValueError(f"model_seat {self.seat!r} is not one of the seats {self.game.seats}")
        fallback = self.game.opponent if scripted_or_none(self.game, self.game.opponent) else RANDOM
        self.players = {
            seat: self.game.scripted(fallback if scripted_or_none(self.game, policy) is None else policy)
            for seat, policy in self.game.policies(label).items()
            if seat != self.seat
        }
        self.rng = random.Random(seed)
        self.game.reset(seed)
        self.earned = 0.0
        if not self._advance():
            raise RuntimeError(f"the game ended before seat {self.seat!r} had a turn")
        return {**state, "observation": self.game.observe(self.seat, first=True)}

    def _advance(self) -> bool:
        """Let the other seats move until it is ours again; False when the game is over."""
        while (seat := self.game.to_move()) is not None:
            if seat == self.seat:
                return True
            self.game.play_policy(seat, self.players[seat], self.rng)
        return False

    async def step(self, state: StepState) -> Result:
        going = self.game.play_text(self.seat, state["action_text"]) and self._advance()
        total = self.game.returns()[self.seat]
        reward, self.earned = total - self.earned, total
        return Result(
            reward=reward,
            terminated=not going,
            observation=self.game.observe(self.seat, first=False) if going else [],
            info={**self.game.info(self.seat), "total_reward": total},
        )

    async def close(self) -> None:
        self.game.close()


@dataclass
class _Seat:
    """One seat's token context: a trajectory when the model plays it, only ids for a frozen checkpoint."""

    engine: Engine
    tokenizer: Any
    traj: Trajectory | None
    ids: list[int] = field(default_factory=list)
    last_action: str | None = None
    turns: int = 0


class SeatRunner(Runner):
    """Runs one game; returns one ``Trajectory`` per model seat (module docstring).

    Args:
        game_factory: called once per episode, returns a ``Game``.
        env_id, spec_hash: stamped on every trajectory.
        max_turns: turns per seat; a game going longer ends truncated.
        engines: ``"checkpoint:PATH"`` -> ``(engine, tokenizer)`` for frozen-checkpoint seats.
    """

    def __init__(
        self,
        game_factory: Callable[[], Game],
        *,
        env_id: str | None = None,
        spec_hash: str | None = None,
        max_turns: int | None = None,
        engines: dict[str, tuple[Engine, Any]] | None = None,
    ) -> None:
        self.game_factory, self.env_id, self.spec_hash, self.max_turns = game_factory, env_id, spec_hash, max_turns
        self.engines = dict(engines or {})
        # set by the host: fn(checkpoint_path) -> (engine, tokenizer), for checkpoints not in ``engines``
        self.engine_loader: Callable[[str], tuple[Engine, Any]] | None = None

    def _engine_for(self, policy: str) -> tuple[Engine, Any]:
        if policy not in self.engines:
            if self.engine_loader is None:
                raise RuntimeError(
                    f"a seat is played by {policy!r}, but this runner has no engine for it; pass "
                    "engines={policy: (engine, tokenizer)} or set SeatRunner.engine_loader (molt-train's rollout "
                    "worker does)"
                )
            self.engines[policy] = self.engine_loader(policy[len(CHECKPOINT) :])
        return self.engines[policy]

    async def execute(self, prompt, label, sampling_params, max_length, tokenizer, engine, images=None, tools=None):
        trajs: list[Trajectory] = []
        stage = ["make"]
        game = None
        try:
            game = self.game_factory()
            if not isinstance(game, Game):
                raise TypeError(f"game factory returned {type(game).__name__}, which is not a molt_envs.seats.Game")
            policies = game.policies(label)
            seats: dict[str, _Seat] = {}
            players: dict[str, Callable[..., Any]] = {}
            for seat, policy in policies.items():
                if policy == MODEL:
                    traj = self._new_trajectory(prompt, label, images)
                    traj.seat = seat
                    trajs.append(traj)
                    seats[seat] = _Seat(engine, tokenizer, traj)
                elif policy.startswith(CHECKPOINT):
                    seats[seat] = _Seat(*self._engine_for(policy), None)
                else:
                    players[seat] = game.scripted(policy)
            seed = seed_from(label)
            rng = random.Random(seed)
            stage[0] = "reset"
            game.reset(seed)
            params = SamplingParams.coerce(sampling_params)
            truncated = False
            while (seat := game.to_move()) is not None:
                if seat in players:
                    stage[0] = "play"
                    game.play_policy(seat, players[seat], rng)
                    continue
                ctx = seats[seat]
                if self.max_turns is not None and ctx.turns >= self.max_turns:
                    truncated = True
                    break
                stage[0] = "tokenize"
                if not await self._observe(ctx, game.observe(seat, first=not ctx.ids), max_length):
                    truncated = True
                    break
                stage[0] = "generate"
                budget = min(params.max_tokens, max_length - len(ctx.ids))
                gen = await ctx.engine.generate(list(ctx.ids), params.updated(max_tokens=budget))
                ctx.ids.extend(gen.token_ids)
                if ctx.traj is not None:
                    ctx.traj.append_action(gen.token_ids, gen.log_probs, gen.finish_reason)
                    ctx.traj.truncated |= gen.finish_reason == "length"
                ctx.turns += 1
                ctx.last_action = await tokenizer_work(4 * len(gen.token_ids), _decode, ctx.tokenizer, gen.token_ids)
                stage[0] = "play"
                game.play_text(seat, ctx.last_action)
            returns = game.returns()
            trajs = [t for t in trajs if seats[t.seat].turns]  # a seat that never moved has nothing to learn from
            for traj in trajs:
                traj.reward = traj.score = returns[traj.seat]
                traj.truncated |= truncated
                traj.num_turns = seats[traj.seat].turns
                traj.info = {"seat": traj.seat, **game.info(traj.seat), "truncated_game": float(truncated)}
        except Exception as exc:  # failure isolation: every seat of the game fails, so it is dropped whole
            for traj in trajs:
                traj.failure = failure_reason(stage[0], exc)
        finally:
            if game is not None:
                try:
                    game.close()
                except Exception as exc:
                    for traj in trajs:
                        traj.failure = traj.failure or f"close: {type(exc).__name__}: {exc}"
        return trajs

    async def _observe(self, ctx: _Seat, messages: list[dict[str, Any]], max_length: int) -> bool:
        """Append the seat's new messages to its context; False when no room is left to generate."""
        if ctx.last_action is None:
            text = render_prompt(ctx.tokenizer, messages)
        else:
            text = render_turn(ctx.tokenizer, messages, None, ctx.last_action)
        ids = await tokenizer_work(len(text), _encode, ctx.tokenizer, text)
        if len(ctx.ids) + len(ids) >= max_length:
            return False
        ctx.ids.extend(ids)
        if ctx.traj is not None:
            ctx.traj.append_observation(ids)
            if ctx.last_action is None:
                ctx.traj.prompt_len = len(ids)
        return True
