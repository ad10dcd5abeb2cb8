"""What a hostile publisher (or a hostile registry) can send, and what it gets: a clear refusal, nothing stored,
nothing installed, no memory blown on the server."""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging_support import rewrite_wheel

from env_registry.installs import install as install_module
from env_registry.packages.artifacts import InvalidArtifact, inspect_release
from env_registry.packages.names import InvalidName, distribution_file
from env_registry.store.local import Forbidden, LocalRegistry


def test_sdist_header_claiming_gigabytes_is_refused_before_it_is_read(tmp_path, echo):
    """tarfile reads a pax header's data in one piece: a few hundred bytes of gzip may claim 600 MB."""
    good = echo.releases["1.0.0"]
    header = tarfile.TarInfo(f"{good.sdist.name.removesuffix('.tar.gz')}/././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, 600 << 20
    bomb = tmp_path / good.sdist.name
    bomb.write_bytes(gzip.compress(header.tobuf(tarfile.USTAR_FORMAT) + bytes(1024)))
    with pytest.raises(InvalidArtifact, match="unpacks to more than"):
        inspect_release(good.wheel, bomb)


def test_direct_reference_dependencies_are_refused(tmp_path, echo):
    """pip would fetch (and build) a `name @ URL` dependency at install time, from anywhere."""
    good = echo.releases["1.0.0"]
    evil = rewrite_wheel(
        good.wheel,
        tmp_path / good.wheel.name,
        ".dist-info/METADATA",
        lambda text: text.replace("\n\n", "\nRequires-Dist: helper @ https://example.com/h.tar.gz\n\n", 1),
    )
    with pytest.raises(InvalidArtifact, match="direct reference"):
        inspect_release(evil, good.sdist)


def test_file_names_carry_no_markup():
    with pytest.raises(InvalidName, match="letters, digits"):
        distribution_file('acme_echo-0.1.0-py3-none-any"><img src=x onerror=alert(1)>.whl')
    assert distribution_file("acme_echo-0.1.0-py3-none-any.whl") == ("acme-echo", "0.1.0", "wheel")


def test_a_locally_published_package_cannot_be_taken_over_by_a_token(tmp_path, echo):
    registry = LocalRegistry(tmp_path / "registry")
    registry.publish(echo.releases["1.0.0"])  # local: no owner
    with pytest.raises(Forbidden, match="published locally"):
        registry.publish(echo.releases["1.0.1"], publisher="mallory")
    with pytest.raises(Forbidden, match="published locally"):
        registry.yank("acme-echo", "1.0.0", "mine now", publisher="mallory")
    assert [r.version for r in registry.package("acme-echo").releases] == ["1.0.0"]
    registry.publish(echo.releases["1.0.1"])  # local publishing still may


def test_install_refuses_a_registry_answer_that_is_not_what_was_asked(tmp_path):
    """A registry that answers an env ID with another distribution's wheel (hash and all from itself)."""
    wheel = SimpleNamespace(filename="requests-99.0-py3-none-any.whl", sha256="0" * 64)
    info = SimpleNamespace(package="acme-echo", version="1.0.0", env_ids=["acme/echo-v1"], wheel=wheel)
    fetched: list[str] = []
    registry = SimpleNamespace(resolve=lambda env_id: info, fetch=lambda *a: fetched.append("fetched") or Path("x"))
    with pytest.raises(install_module.InstallError, match="not a wheel of a release providing it"):
        install_module.install("acme/echo-v1", registry)
    info.wheel = SimpleNamespace(filename="acme_echo-1.0.0-py3-none-any.whl", sha256="0" * 64)
    with pytest.raises(install_module.InstallError, match="not a wheel of a release providing it"):
        install_module.install("acme/other-v1", registry)  # the release does not provide that ID
    assert fetched == []  # refused before anything was downloaded


def test_the_server_names_no_path_of_its_own(server):
    from env_registry.store.client import RegistryClient
    from env_registry.store.local import NotFound

    with pytest.raises(NotFound) as caught:
        RegistryClient(server.url).resolve("acme/nope-v1")
    assert "no package in this registry provides env ID 'acme/nope-v1'" in str(caught.value)
    assert str(server.root) not in str(caught.value)
