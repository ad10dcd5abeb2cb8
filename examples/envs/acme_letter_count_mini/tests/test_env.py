"""The env as installed passes the conformance checks (`pip install -e .`, then `pytest`)."""

from env_registry import check_env


def test_conformance():
    check_env("acme/letter-count-mini-v1").assert_passed()
