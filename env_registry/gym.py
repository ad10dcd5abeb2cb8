"""``import env_registry.gym`` registers every molt ID in Gymnasium's own registry, lazily (no env module is imported
until ``gymnasium.make``); ``gymnasium.make("env_registry.gym:molt/arith-v1")`` needs no import at all. The adapter
itself is ``env_registry.ecosystems.gymnasium``.
"""

from env_registry.ecosystems.gymnasium import MoltGymEnv, register_all

__all__ = ["MoltGymEnv", "register_all"]

register_all()
