"""The agent contract, the runners, the Engine protocol and the built-in environments.

Importing this package never imports torch or ray.
"""

from molt_envs.chat_runner import ChatAgentRunner
from molt_envs.contract import ChatAgent, ChatContext, Env, Result, SamplingParams, StepState
from molt_envs.engine import Engine, Generation
from molt_envs.judge import JudgeClient, JudgeError
from molt_envs.runners import Runner, StepEnvRunner, load_agent_runner, render_prompt
from molt_envs.trajectory import Trajectory

__all__ = [
    "ChatAgent",
    "ChatAgentRunner",
    "ChatContext",
    "Engine",
    "Env",
    "Generation",
    "JudgeClient",
    "JudgeError",
    "Result",
    "Runner",
    "SamplingParams",
    "StepEnvRunner",
    "StepState",
    "Trajectory",
    "load_agent_runner",
    "render_prompt",
]
