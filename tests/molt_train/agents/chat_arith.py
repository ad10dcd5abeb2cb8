"""A ChatAgent on arith: one chat completion through a stock OpenAI client against the session server."""

from openai import AsyncOpenAI

from molt_envs import ChatAgent, ChatAgentRunner, Result
from molt_envs.envs.arith import parse_answer


class ArithChat(ChatAgent):
    async def run(self, ctx):
        client = AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key)
        resp = await client.chat.completions.create(
            model=ctx.model_name,
            messages=ctx.messages,
            max_tokens=ctx.sampling_params.max_tokens,
            temperature=ctx.sampling_params.temperature,
        )
        answer = parse_answer(resp.choices[0].message.content or "")
        return Result(reward=float(answer is not None and answer == int(ctx.label)))


class AgentRunner(ChatAgentRunner):
    def __init__(self):
        super().__init__(ArithChat, env_id="test/chat-arith")
