"""Error types of the registry. Every message names the offending value and says what to do."""


class Error(Exception):
    """Base class of registry errors."""


class InvalidEnvId(Error, ValueError):
    """The string is not a valid ``[namespace/]name[-vN][@package_version]`` ID."""


class RegistrationError(Error):
    """An env cannot be registered (conflicting versioned/unversioned IDs, bad entry point, ...)."""


class UnregisteredEnv(Error):
    """No env is registered under the requested ID."""


class NamespaceNotFound(UnregisteredEnv):
    pass


class NameNotFound(UnregisteredEnv):
    pass


class VersionNotFound(UnregisteredEnv):
    pass


class DeprecatedEnv(Error):
    """The requested version is older than the latest and no longer registered."""


class PackageVersionMismatch(Error):
    """``make("ns/name-v1@X")`` pinned a package version other than the one installed."""


class ManifestError(Error, ValueError):
    """A ``[tool.molt.env]`` manifest is invalid."""


class DeprecatedEnvWarning(UserWarning):
    """An older registered version was requested, or an unversioned ID resolved to the latest version."""


class NotAGymnasiumEnv(Error, TypeError):
    """A ChatAgent ID was asked for as a Gymnasium env: it owns its loop, so it has no ``step(action)`` to drive."""
