"""Exceptions raised at the caller (as opposed to model failures, which are Results)."""


class SandboxError(Exception):
    """Base class for sandbox failures that are the host's problem, not the snippet's."""


class SandboxUnavailable(SandboxError):
    """The requested provider cannot give the promised isolation on this host; the message says what is missing."""


class WorkerDied(SandboxError):
    """A worker's process or channel failed mid-request (reported to callers as status "infra_error")."""
