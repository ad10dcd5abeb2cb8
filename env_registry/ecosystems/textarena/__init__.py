"""TextArena: every one of its games as ``textarena:ID`` (``textarena:GuessTheNumber-v0``, ``textarena:TicTacToe-v0``).

The IDs are TextArena's own registry's (``textarena.envs.registration.ENV_REGISTRY``), without the ``-train`` and
``-raw`` copies it registers of each: those differ from the plain ID only in how TextArena wraps observations into one
prompt per turn, while here each turn is a chat turn (below), so the plain ID is the one to use.

- A one-player puzzle (Wordle, Minesweeper, GuessTheNumber, ...) is a multi-turn ``Env``: the first prompt is the
  player's observation, each model reply is the action (special tokens stripped; TextArena's own action wrappers,
  e.g. adding ``[...]``, applied), the game's new messages come back as the next user turn, and the game's reward
  (TextArena's, invalid moves included: its rules give a retry, then the penalty) is the episode's reward.
- A game of two or more players (TicTacToe, Poker, SecretMafia, ...) is a ``molt_envs.seats.Game`` (kind ``game``)
  with seats ``player_0``, ``player_1``, ...: self-play puts the policy on every seat, one trajectory per seat, each
  with its own reward; ``mode="vs"`` plays one seat against ``opponent`` (``"random"``: ``random_move``).

Each turn's observation is the messages TextArena sent that player since its last turn, each line ``[SENDER] text``
(what TextArena's ``LLMObservationWrapper`` shows, without repeating earlier turns, which are in the chat already).

Tasks are reset seeds: row ``i`` of a split resets the game with seed ``seed + i`` (train from 0, test from
1_000_000), so the samples of one row play the same game; a game's test rows play against a random player, the model
taking each seat in turn. TextArena seeds Python's module-level ``random``; each game here keeps its own copy of that
state, so games running side by side do not change each other's course.

``textarena:ID?key=value`` sets arguments of the game's constructor (checked against its signature and the type of
its registered value); ``num_players=n`` picks a player count the game accepts.

Availability: an env that cannot run here (it downloads NLTK corpora at import, calls an LLM through OpenRouter, has
a bug at reset) is listed as unavailable with the reason, and resolving it fails with that reason. That is decided by
trying: a probe process makes and resets every game with the network switched off (one forked child per game, each
with a timeout), and the results are cached under ``$MOLT_CACHE/textarena/`` per TextArena and Python version (a
probe that timed out, perhaps on a busy machine, is tried again next time). Only the probe switches the network off.

One-player envs run in an env server of their own (the ``Adapter`` default). Games run in the caller's process: the
env protocol carries ``reset``/``step`` of one policy (and ChatAgent runs), not a game whose seats several policies
play in turn, so a game cannot live behind an env server yet.

The room: ``source`` (the scheme: catalog, availability probe, specs) over ``play`` (the env and game classes an env
server or the caller runs, the random player, the seed rows).
"""
