"""The session server and its wires: one rollout per session, captured token-exactly, whatever the client speaks.

``server.py`` (``SessionServer``: FastAPI + uvicorn, ``ChatAgentRunner`` in-process, ``molt-train serve``
standalone) routes each wire's requests to ``session.py`` (``Session``: the token-exact capture of one rollout);
``wire_openai.py``, ``wire_responses.py`` and ``wire_anthropic.py`` translate OpenAI Chat Completions, OpenAI
Responses and Anthropic Messages to and from it, with ``request_fields.py``'s checked field readers.

May import: the contract below it (``molt_envs.contract``, ``engine``, ``runners``, ``trajectory``, ``tool_calls``,
``vision``). Never ``envs``, ``bridges``, ``seats``, ``chat_runner`` or ``remote``. This ``__init__`` re-exports
nothing: import from the module that defines the name.
"""
