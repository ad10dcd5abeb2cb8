"""``molt/chat-geo-tool-v1``: ``molt/geo-tool-v1`` as a ChatAgent on the OpenAI SDK, the figure sent as an image part.

The agent owns the loop on a stock ``openai.AsyncOpenAI``: its first request carries the row's figure as an
``image_url`` part (a base64 PNG ``data:`` URI, since the session server fetches nothing), the question as text, and
the ``python_executor`` tool; it runs every call the model makes in the sandbox and sends the results back as
``tool`` messages, and stops on a ``\\boxed{}`` (or ``<answer>``) answer, an answer without a call, or the turn cap.
Only the final answer is graded. The session server captures the conversation token-exactly, the figure's
placeholder tokens and tensors with it.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from molt_envs.contract import ChatContext, Result
from molt_envs.envs.chat_python_tool import ChatPythonToolAgent
from molt_envs.envs.geo_tool import SYSTEM_PROMPT, boxed
from molt_envs.vision import load_image


def data_uri(image: Any) -> str:
    """A PNG ``data:`` URI of an image (a PIL image, bytes or base64, as ``ChatContext.images`` may hold)."""
    buffer = io.BytesIO()
    load_image(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


class ChatGeoToolAgent(ChatPythonToolAgent):
    system_prompt = SYSTEM_PROMPT

    def first_messages(self, ctx: ChatContext) -> list[dict]:
        """The system prompt, then the row's question with its figure(s) as ``image_url`` parts before the text."""
        messages = super().first_messages(ctx)
        if ctx.images:
            user = next(i for i, m in enumerate(messages) if m["role"] == "user")
            images = [{"type": "image_url", "image_url": {"url": data_uri(image)}} for image in ctx.images]
            messages[user] = {**messages[user], "content": [*images, {"type": "text", "text": ctx.prompt}]}
        return messages

    async def _graded(self, text: str, label: object, turns: int) -> Result:
        return await super()._graded(boxed(text), label, turns)
