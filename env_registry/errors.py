"""Every error the registry raises, each named for the boundary it guards: an ID, a registration, a lookup, a
manifest, a package name, a release file, a build, an install. Every message names the offending value and says what
to do. The registry server's store keeps its HTTP-status errors (`Conflict`, `NotFound`, `Forbidden`) in
``env_registry.store.local``; they derive from `Error` like these.
"""


class Error(Exception):
    """Base class of every error the registry raises (catch this to catch them all)."""


class InvalidEnvId(Error, ValueError):
    """Raised when a string is not a valid ``[namespace/]name[-vN][@package_version]`` env ID."""


class RegistrationError(Error):
    """Raised when an env cannot be registered (versioned and unversioned IDs in conflict, a bad entry point, ...)."""


class UnregisteredEnv(Error):
    """Raised when no env is registered under the requested ID (the base of the three below)."""


class NamespaceNotFound(UnregisteredEnv):
    """Raised when the ID's namespace has no registered env at all."""


class NameNotFound(UnregisteredEnv):
    """Raised when the namespace has no env of that name (the message suggests close names), or when the module of a
    ``"module:ns/name-v1"`` ID cannot be imported."""


class VersionNotFound(UnregisteredEnv):
    """Raised when the requested version is newer than every registered one (the message lists those)."""


class DeprecatedEnv(Error):
    """Raised when the requested version is older than the latest and no longer registered, or the env is registered
    without a version."""


class PackageVersionMismatch(Error):
    """Raised when ``make("ns/name-v1@X")`` pins a package version other than the installed one."""


class ManifestError(Error, ValueError):
    """Raised when a ``[tool.molt.env]`` manifest is invalid (the message names the field and the value)."""


class InvalidName(Error, ValueError):
    """Raised when a package, version, file or publisher name is one the registry refuses."""


class InvalidArtifact(Error, ValueError):
    """Raised when a wheel or sdist is not a well-formed env package release."""


class BuildError(Error):
    """Raised when a source tree cannot be built into a release."""


class HashMismatch(Error):
    """Raised when a downloaded file does not match the sha256 the registry's index lists for it."""


class InstallError(Error):
    """Raised when pip fails to install a release."""


class EnvServerUnavailable(Error):
    """An env server cannot be used: nothing answers at its URL, it is no env server, it speaks another protocol
    version, it does not serve the ID, or the server of an isolated install does not start."""


class IsolatedInstallError(Error):
    """An isolated install (a package in a virtual environment of its own) failed or is broken."""


class DeprecatedEnvWarning(UserWarning):
    """Warned when an older registered version is requested, or an unversioned ID resolves to the latest version."""


class NotAGymnasiumEnv(Error, TypeError):
    """Raised when a ChatAgent ID is asked for as a Gymnasium env: it owns its loop, so it has no ``step(action)``."""
