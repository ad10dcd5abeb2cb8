"""``ChatAgentRunner``: runs a ``ChatAgent`` against the session server and returns its token-exact segments."""

from __future__ import annotations

from molt_envs.runners import Runner


class ChatAgentRunner(Runner):
    def __init__(self, agent_factory, *, env_id: str | None = None, spec_hash: str | None = None) -> None:
        self.agent_factory = agent_factory
        self.env_id = env_id
        self.spec_hash = spec_hash

    async def execute(self, prompt, label, sampling_params, max_length, tokenizer, engine, images=None, tools=None):
        raise NotImplementedError("ChatAgentRunner needs the session server, which is not built yet")
