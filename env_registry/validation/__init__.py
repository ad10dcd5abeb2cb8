"""``molt-env validate``: install an env package into a fresh venv and check it inside the sandbox jail.

``validate(target) -> ValidationReport`` is the one entry point (the registry server's publish gate calls it too);
``report.ok`` is the verdict, ``report.to_json()`` its stored form.

May import: ``store`` (the publish gate's states), ``packages``, ``evaluation`` (the reference eval of the difficulty
calibration, ``calibration``), ``ecosystems`` (which IDs ``molt-env calibrate`` takes, ``foreign``) and the top of
``env_registry``; never ``hub``.
"""

from env_registry.validation.report import Check, ValidationReport
from env_registry.validation.validate import validate

__all__ = ["Check", "ValidationReport", "validate"]
