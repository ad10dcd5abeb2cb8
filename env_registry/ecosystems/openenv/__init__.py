"""OpenEnv (Hugging Face / Meta), both ways.

Our IDs as OpenEnv environments: ``molt-env serve-env ID... --protocol openenv`` (``server``).

OpenEnv's envs under our IDs (``wire``, ``source``, ``env``): an OpenEnv env server as ``openenv:http://host:port``, or an installed OpenEnv env
package as ``openenv:PACKAGE``, driven through OpenEnv's own client (``GenericEnvClient``, one WebSocket session per
episode).

- ``openenv:http://host:port``: a server already running. Resolving the ID checks it is one (``/health``,
  ``/schema``, ``/metadata``) and fails naming the URL when nothing answers there, it is some other HTTP server, or
  its answers are garbage. The spec is made from its answers (once per process and ID): the action schema, the
  env's name and description; ``upstream`` carries the openenv library's version and the server's own
  (``server_version``, from ``/metadata``).
- ``openenv:PACKAGE``: an OpenEnv env package (OpenEnv's layout: ``PACKAGE/server/app.py`` defines ``app``, or the
  ``app:`` of its ``openenv.yaml``), which this process serves with uvicorn on a free loopback port, in a process of
  its own started on first use and stopped at exit (``env_registry.serving.managed_servers``; restarted when it
  dies). ``?python=/path/to/venv/bin/python`` serves it from another interpreter (a venv of its own, which needs
  ``openenv`` and the package; this process needs only ``openenv`` for the client). ``molt-env list --source
  openenv`` lists the OpenEnv env packages installed here (distributions ``openenv-NAME``).

The env (``OpenEnvEnv``, multi-turn) resets the session with the dataset row's seed, shows the model the
observation (each field as ``name: value``) with the action format in a system message, and steps each reply:

- the reply is parsed into an action by ``parse_action``: a JSON object, the last ```json fenced block, the text
  between its first ``{`` and last ``}``, or, when the action schema has one required string field (or requires
  none and has one string field), the raw text as that field;
- an MCP env (its action is OpenEnv's ``CallToolAction``, or the bare ``Action``) lists its tools at reset
  (``list_tools``): they become the episode's tools, and each ``<tool_call>`` of a reply is one ``call_tool`` step
  whose result comes back as a ``tool`` message;
- each step's reward (``null`` counts 0) is that turn's ``Result.reward``, so the runners' sum over turns is the
  episode's reward (a reward at reset is added to the first turn's); ``done`` ends the episode; ``score`` is the
  episode's reward so far.

**Invalid actions.** A reply that parses into no action, or whose action the server refuses (``VALIDATION_ERROR``;
the server's env never sees it, so it cannot reward it), earns ``invalid_reward`` (default 0) and ends the episode
with ``info["invalid_action"] = 1`` (what ``molt-env eval`` counts as ``invalid_action``); with
``max_invalid_actions = N`` the first N instead earn ``invalid_reward`` and a user turn saying what was wrong, and
the episode goes on. ``info["invalid_actions"]`` counts them all.

**Failures** end the episode with a reason the runners count (``rollout/dropped/failure_<stage>``): no server
(``remote_connect``), the connection broke (``remote_lost``: the session cannot be resumed; a served package's
server is restarted for later episodes), no answer within ``timeout_s`` (``remote_timeout``), an answer that is not
OpenEnv's (``remote_protocol``), the server still at ``max_concurrent_envs`` after ``timeout_s`` of asking again
(``remote_capacity``: a session waits for a free one, so a server of one session serves episodes one by one); the
env's own error (``EXECUTION_ERROR``) keeps the runner's stage (``reset``/``step``), a failing env factory is
``make``.

**Tasks are reset seeds**: row i of ``train`` resets with seed i (0..999), row i of ``test`` with 1_000_000 + i
(200 rows), and every sample of a row with the same seed, so pass@k is per task; ``?seeds=[3,5,8]`` makes both
splits those seeds.

ID kwargs (``openenv:http://127.0.0.1:8000?max_invalid_actions=2&reward_range=[-1,1]``): ``timeout_s`` (one
answer, default 120), ``invalid_reward``, ``max_invalid_actions``, ``reward_range`` (the spec's, default [0, 1]:
OpenEnv does not say; for a package, its ``openenv.yaml``'s), ``max_turns``, ``seeds``, ``python`` (packages).

May import what ``env_registry.ecosystems`` may; ``wire`` is below ``source`` and ``env``, ``server`` stands alone.
"""
