"""The env protocol: how an ``Env`` or ``ChatAgent`` served in another process is driven over HTTP + WebSocket.

It speaks OpenEnv's framing (``meta-pytorch/OpenEnv``, ``openenv.core.env_server``): one WebSocket per episode at
``/ws``, client messages ``{"type": "reset" | "step" | "close", "data": {...}}``, server answers
``{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}`` or
``{"type": "error", "data": {"message": ..., "code": ...}}``, and ``GET /health``, ``/metadata``, ``/schema``.
What OpenEnv leaves open is fixed here: a protocol version, the payloads (the ``molt_envs`` contract: ``reset``'s
state dict, ``StepState``, ``Result``, ``ChatContext``), a ``run`` message for chat agents, a ``closed`` answer
that carries ``Env.close`` failures back, the env's dataset splits served as JSON lines, and games
(``molt_envs.seats.Game``, ``kind="game"``): a WebSocket is then one session holding one game instance, driven call
by call (``game``, ``game_reset``, ``to_move``, ``observe``, ``play_text``, ``play_policy``, ``returns``, ``info``,
``close``), each answered ``{"type": "game", "data": GameAnswer}``; scripted seats (``play_policy``) are played
where the game lives, the model's and frozen checkpoints' moves arrive as ``play_text``.

Routes of a server for env ``ns/name-v1`` (several envs may share a server; each lives under its ID):

- ``GET /health``: ``{"status": "healthy", "protocol": "molt-env/1", "envs": ["ns/name-v1"]}``
- ``GET /ns/name-v1/metadata``: ``{"protocol", "id", "kind", "hash", "spec", "max_episodes"}``
- ``GET /ns/name-v1/schema``: JSON schemas of the messages (``protocol_json_schema()``)
- ``GET /ns/name-v1/datasets/{split}?limit=N``: the split's rows, one JSON object a line
- ``WS /ns/name-v1/ws?protocol=1``: one episode

Images are reserved: the ``images`` fields are lists of base64-encoded PNGs, always empty in version 1 (a rollout
with images fails with a clear error instead of sending them).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from molt_envs.contract import Result, SamplingParams, StepState

PROTOCOL_NAME = "molt-env"
PROTOCOL_VERSION = 1
PROTOCOL = f"{PROTOCOL_NAME}/{PROTOCOL_VERSION}"

# error codes (OpenEnv's names where it has one)
INVALID_JSON = "INVALID_JSON"
VALIDATION_ERROR = "VALIDATION_ERROR"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
EXECUTION_ERROR = "EXECUTION_ERROR"  # the env raised; ``data.exception`` names the exception type
FACTORY_ERROR = "FACTORY_ERROR"  # making the env instance raised
PROTOCOL_MISMATCH = "PROTOCOL_MISMATCH"


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class ResetState(BaseModel):
    """``Env.reset``'s argument and answer: the first observation (a prompt string or chat messages), the label,
    images, and optionally OpenAI tool schemas. An env may add keys of its own; they travel as they are."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    observation: Any
    label: Any = None
    images: list[str] = Field(default_factory=list, max_length=0)  # reserved: base64 PNGs
    tools: list[dict[str, Any]] | None = None


class StepAction(_Message):
    """``StepState`` on the wire (``sampling_params`` as a dict of ``SamplingParams`` fields)."""

    observation_text: str
    action_text: str
    label: Any = None
    sampling_params: dict[str, Any]
    turn: int = Field(ge=0)
    images: list[str] = Field(default_factory=list, max_length=0)


class ChatRun(_Message):
    """``ChatContext`` on the wire: the agent calls the policy at ``base_url``/``session_url`` (the trainer's session
    server), so a served chat agent must be able to reach that address."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    prompt: str
    label: Any = None
    images: list[str] = Field(default_factory=list, max_length=0)
    base_url: str
    session_url: str
    model_name: str
    api_key: str
    session_id: str
    sampling_params: dict[str, Any]
    max_length: int


class StepObservation(_Message):
    """``Result`` minus its reward (which OpenEnv's framing carries beside the observation)."""

    observation: Any = ""  # str, or chat messages
    terminated: bool = True
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    score: float | None = None
    images: list[str] = Field(default_factory=list, max_length=0)
    sampling_params: dict[str, Any] | None = None


class ResetMessage(_Message):
    type: Literal["reset"]
    data: ResetState


class StepMessage(_Message):
    type: Literal["step"]
    data: StepAction


class RunMessage(_Message):
    type: Literal["run"]
    data: ChatRun


class CloseMessage(_Message):
    type: Literal["close"]
    data: dict[str, Any] = Field(default_factory=dict)


# -- a game (``molt_envs.seats.Game``): one WebSocket is one session holding one game instance, which the client drives
# call by call (``game`` first: it makes the instance and says its seats; then ``game_reset``, ``observe``, ...) --


class GameReset(_Message):
    seed: int | None = None


class GameSeat(_Message):
    seat: str


class GameObserve(_Message):
    seat: str
    first: bool


class GamePlayText(_Message):
    seat: str
    text: str


class GamePlayPolicy(_Message):
    """A scripted seat's move, played where the game lives: ``policy`` is ``"random"`` or ``"pkg.mod:fn"`` (never
    ``"model"`` or ``"checkpoint:..."``: those are generated by the client and sent as ``play_text``); ``rng_state`` is
    the client's ``random.Random.getstate()``, the answer carries it back as the policy left it (so a game draws the
    same moves in and out of process)."""

    seat: str
    policy: str
    rng_state: tuple[int, list[int], float | None]


class GameMessage(_Message):
    type: Literal["game"]
    data: dict[str, Any] = Field(default_factory=dict)


class GameResetMessage(_Message):
    type: Literal["game_reset"]
    data: GameReset


class ToMoveMessage(_Message):
    type: Literal["to_move"]
    data: dict[str, Any] = Field(default_factory=dict)


class ObserveMessage(_Message):
    type: Literal["observe"]
    data: GameObserve


class PlayTextMessage(_Message):
    type: Literal["play_text"]
    data: GamePlayText


class PlayPolicyMessage(_Message):
    type: Literal["play_policy"]
    data: GamePlayPolicy


class ReturnsMessage(_Message):
    type: Literal["returns"]
    data: dict[str, Any] = Field(default_factory=dict)


class InfoMessage(_Message):
    type: Literal["info"]
    data: GameSeat


ClientMessage = Annotated[
    ResetMessage
    | StepMessage
    | RunMessage
    | CloseMessage
    | GameMessage
    | GameResetMessage
    | ToMoveMessage
    | ObserveMessage
    | PlayTextMessage
    | PlayPolicyMessage
    | ReturnsMessage
    | InfoMessage,
    Field(discriminator="type"),
]
GAME_CALLS = ("game", "game_reset", "to_move", "observe", "play_text", "play_policy", "returns", "info")


class ResetAnswer(_Message):
    observation: ResetState
    reward: float | None = None
    done: bool = False


class StepAnswer(_Message):
    observation: StepObservation
    reward: float
    done: bool


class ResetObservationMessage(_Message):
    type: Literal["observation"]
    data: ResetAnswer


class StepObservationMessage(_Message):
    type: Literal["observation"]
    data: StepAnswer


class GameSetup(_Message):
    """A game's seats and who plays them (``Game.seats``, ``mode``, ``opponent``, ``seat_policies``)."""

    seats: list[str] = Field(min_length=1)
    mode: str
    opponent: str
    seat_policies: dict[str, str] = Field(default_factory=dict)


class GameAnswer(_Message):
    """The answer to a game call: ``to_move`` after ``game_reset``, ``to_move`` and the plays (the seat to move next,
    null when the game is over), and the call's own value: ``setup`` (``game``), ``going`` (``play_text``, ``play_policy``, which
    also carries ``rng_state`` back), ``messages`` (``observe``), ``returns``, ``info``."""

    to_move: str | None = None
    setup: GameSetup | None = None
    going: bool | None = None
    rng_state: tuple[int, list[int], float | None] | None = None
    messages: list[dict[str, Any]] | None = None
    returns: dict[str, float] | None = None
    info: dict[str, float] | None = None


class GameAnswerMessage(_Message):
    type: Literal["game"]
    data: GameAnswer


class ErrorData(_Message):
    model_config = ConfigDict(extra="allow")

    message: str
    code: str
    exception: str | None = None


class ErrorMessage(_Message):
    type: Literal["error"]
    data: ErrorData


class ClosedMessage(_Message):
    type: Literal["closed"]
    data: dict[str, Any] = Field(default_factory=dict)


def _reply(answer: type[_Message]) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[answer | ErrorMessage, Field(discriminator="type")])


CLIENT_MESSAGE: TypeAdapter[Any] = TypeAdapter(ClientMessage)
RESET_REPLY = _reply(ResetObservationMessage)  # what the server answers to each client message
STEP_REPLY = _reply(StepObservationMessage)  # (to "step" and to "run")
CLOSE_REPLY = _reply(ClosedMessage)
GAME_REPLY = _reply(GameAnswerMessage)  # (to every game call)


class Health(BaseModel):
    """``GET /health``; extra keys are allowed so that a later minor revision can add some."""

    status: str
    protocol: str
    envs: list[str]


class Metadata(BaseModel):
    """``GET /<env id>/metadata``: the spec (``EnvSpec`` JSON) and its hash, as the server's registry computed them."""

    protocol: str
    id: str
    kind: Literal["env", "chat_agent", "game"]
    hash: str
    spec: dict[str, Any]
    max_episodes: int | None = None


def protocol_json_schema() -> dict[str, Any]:
    """JSON schemas of every message and document of the protocol (what ``/schema`` serves; OpenEnv's ``action`` /
    ``observation`` / ``state`` keys name the step, its answer and the reset state)."""
    return {
        "protocol": PROTOCOL,
        "action": StepAction.model_json_schema(),
        "observation": StepObservation.model_json_schema(),
        "state": ResetState.model_json_schema(),
        "client_message": CLIENT_MESSAGE.json_schema(),
        "reset_reply": RESET_REPLY.json_schema(),
        "step_reply": STEP_REPLY.json_schema(),
        "close_reply": CLOSE_REPLY.json_schema(),
        "game_reply": GAME_REPLY.json_schema(),
        "health": Health.model_json_schema(),
        "metadata": Metadata.model_json_schema(),
    }


# -- the contract's objects <-> wire payloads (outgoing messages are plain dicts for json.dumps: they are built from
# objects the contract already validated, and each side validates what it receives against the models above) --


def dumps(message: dict[str, Any]) -> str:
    """A message as JSON text; ``TypeError``/``ValueError`` for a value JSON cannot carry."""
    return json.dumps(message, separators=(",", ":"))


def error_message(code: str, message: str, exception: str | None = None) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, "exception": exception}}


def no_images(images: list[Any] | None, where: str) -> list[str]:
    """Version 1 carries no images: refuse them clearly instead of dropping them."""
    if images:
        raise NotImplementedError(
            f"{where} holds {len(images)} image(s), which protocol {PROTOCOL} cannot carry yet "
            "(the images fields are reserved for base64 PNGs); run this env in process"
        )
    return []


def sampling_dict(params: SamplingParams | dict[str, Any] | None) -> dict[str, Any] | None:
    # vars(), not dataclasses.asdict: its recursive deep copy is a tenth of a step's cost, and the fields are flat
    return dict(vars(params)) if isinstance(params, SamplingParams) else params


def step_message(state: StepState) -> dict[str, Any]:
    return {
        "type": "step",
        "data": {
            "observation_text": state["observation_text"],
            "action_text": state["action_text"],
            "label": state["label"],
            "sampling_params": sampling_dict(state["sampling_params"]),
            "turn": state["turn"],
            "images": no_images(state.get("images"), "the step's context"),
        },
    }


def step_state(action: StepAction) -> StepState:
    return {
        "observation_text": action.observation_text,
        "action_text": action.action_text,
        "label": action.label,
        "sampling_params": SamplingParams(**action.sampling_params),
        "turn": action.turn,
        "images": [],
    }


def result_message(result: Result) -> dict[str, Any]:
    """A ``Result`` as the answer to a step (``done`` as OpenEnv means it: terminated or truncated)."""
    observation = {
        "observation": result.observation,
        "terminated": result.terminated,
        "truncated": result.truncated,
        "info": result.info,
        "score": result.score,
        "images": no_images(result.images, "Result.images"),
        "sampling_params": sampling_dict(result.sampling_params),
    }
    return {
        "type": "observation",
        "data": {"observation": observation, "reward": result.reward, "done": result.terminated or result.truncated},
    }


def answer_result(answer: StepAnswer) -> Result:
    obs = answer.observation
    return Result(
        reward=answer.reward,
        observation=obs.observation,
        terminated=obs.terminated,
        truncated=obs.truncated,
        info=obs.info,
        score=obs.score,
        sampling_params=obs.sampling_params,
    )
