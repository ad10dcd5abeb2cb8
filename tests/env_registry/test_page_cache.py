"""The server's page cache (``env_registry.hub.page_cache``) against real servers on one database: every write through
one replica, or by another process on the database, shows on the other replica's cached pages at once, and a
private server never replays one reader's page to another, nor to a refused request."""

from __future__ import annotations

import httpx
import pytest
from packaging_support import start_server

from env_registry.store.client import RegistryClient
from env_registry.store.local import LocalRegistry

PAGES = ("/simple/acme-echo/", "/api/resolve?env_id=acme/echo-v1", "/packages/acme-echo")
REPORT = {"isolation": "jail", "checks": [{"name": "determinism", "passed": True, "detail": "", "env_id": None}]}


def look(url: str, **kwargs) -> dict[str, httpx.Response]:
    """GET every cached page of acme-echo (each must answer 200)."""
    found = {path: httpx.get(url + path, **kwargs) for path in PAGES}
    for path, response in found.items():
        assert response.status_code == 200, (path, response.status_code, response.text[:500])
    return found


def cache_states(found: dict[str, httpx.Response]) -> list[str]:
    return [found[path].headers["x-cache"] for path in PAGES]


def test_a_write_shows_on_the_other_replica_at_once(backend, request, tmp_path, echo):
    db = request.getfixturevalue("postgres").new_database() if backend == "postgresql" else None
    root = tmp_path / "registry"
    extra = ["--db", db] if db else []
    a = start_server(root, *extra)
    b = start_server(root, *extra)  # a second server on the same database and file store
    gate = None
    try:
        writer = RegistryClient(a.url, a.token)
        writer.publish(echo.releases["1.0.0"])
        first, second = look(b.url), look(b.url)
        assert cache_states(first) == ["miss"] * 3 and cache_states(second) == ["hit"] * 3
        assert all(second[p].text == first[p].text for p in PAGES)

        writer.publish(echo.releases["1.0.1"])  # through replica a: b's cached pages are stale now
        after = look(b.url)
        assert cache_states(after) == ["miss"] * 3
        assert "acme_echo-1.0.1-py3-none-any.whl" in after["/simple/acme-echo/"].text
        assert after["/api/resolve?env_id=acme/echo-v1"].json()["version"] == "1.0.1"
        assert "1.0.1" in after["/packages/acme-echo"].text
        assert cache_states(look(b.url)) == ["hit"] * 3

        writer.yank("acme-echo", "1.0.1", "broken build")
        after = look(b.url)
        assert cache_states(after) == ["miss"] * 3
        assert 'data-yanked="broken build"' in after["/simple/acme-echo/"].text
        assert after["/api/resolve?env_id=acme/echo-v1"].json()["version"] == "1.0.0"
        assert "yanked: broken build" in after["/packages/acme-echo"].text
        look(b.url)

        wheel = echo.releases["1.0.0"].wheel.name  # a download through a: the install counts change, the index not
        assert httpx.get(f"{a.url}/files/acme-echo/{wheel}").status_code == 200
        after = look(b.url)
        assert cache_states(after) == ["hit", "miss", "miss"]
        assert after["/api/resolve?env_id=acme/echo-v1"].json()["downloads"] == 1

        # another process on the database (as the publish gate is): a pending upload stays off the index until its
        # verdict, which shows at once
        gate = LocalRegistry(root, db=db)
        gate.publish(echo.releases["1.0.2"], publisher="acme", pending_validation=True)
        after = look(b.url)
        assert "acme_echo-1.0.2" not in after["/simple/acme-echo/"].text
        assert after["/api/resolve?env_id=acme/echo-v1"].json()["version"] == "1.0.0"
        assert gate.set_validation("acme-echo", "1.0.2", "passed", REPORT)
        after = look(b.url)
        assert cache_states(after) == ["miss"] * 3
        assert "acme_echo-1.0.2-py3-none-any.whl" in after["/simple/acme-echo/"].text
        assert after["/api/resolve?env_id=acme/echo-v1"].json()["version"] == "1.0.2"
    finally:
        if gate is not None:
            gate.close()
        a.stop()
        b.stop()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the key does not depend on the backend
def test_a_private_server_never_replays_one_readers_page_to_another(backend, tmp_path, echo):
    root = tmp_path / "registry"
    live = start_server(root, "--private")
    registry = LocalRegistry(root)
    try:
        RegistryClient(live.url, live.token).publish(echo.releases["1.0.0"])
        beta_id, beta = registry.mint_token("beta")
        sessions = {}
        for name, token in (("acme", live.token), ("beta", beta)):
            login = httpx.post(f"{live.url}/login", data={"token": token, "next": "/"})
            assert login.status_code == 303
            sessions[name] = {"molt_session": login.cookies["molt_session"]}

        acme = look(live.url, cookies=sessions["acme"])
        assert cache_states(look(live.url, cookies=sessions["acme"])) == ["hit"] * 3
        assert '<span class="viewer">acme</span>' in acme["/packages/acme-echo"].text
        other = look(live.url, cookies=sessions["beta"])  # another reader: rendered for them, never acme's page
        assert cache_states(other) == ["miss"] * 3
        assert '<span class="viewer">beta</span>' in other["/packages/acme-echo"].text
        assert '<span class="viewer">acme</span>' not in other["/packages/acme-echo"].text
        by_token = look(live.url, headers={"Authorization": f"Bearer {beta}"})
        assert cache_states(by_token) == ["miss"] * 3  # a token reads as itself: no session's page
        assert 'class="viewer"' not in by_token["/packages/acme-echo"].text
        assert cache_states(look(live.url, headers={"Authorization": f"Bearer {beta}"})) == ["hit"] * 3

        for path in PAGES:  # refused reads never reach the cache, warm as it is
            for kwargs in (
                {},
                {"headers": {"Authorization": "Bearer molt_forged"}},
                {"cookies": {"molt_session": "?"}},
            ):
                refused = httpx.get(live.url + path, **kwargs)
                assert refused.status_code in (401, 403) and "x-cache" not in refused.headers, (path, kwargs)
                assert "acme_echo-1.0.0" not in refused.text
        registry.revoke_token(beta_id)  # revoked: its cached answers are not replayed, nor its session's
        for kwargs in ({"headers": {"Authorization": f"Bearer {beta}"}}, {"cookies": sessions["beta"]}):
            for path in PAGES:
                refused = httpx.get(live.url + path, **kwargs)
                assert refused.status_code in (401, 403) and "x-cache" not in refused.headers, (path, kwargs)
        assert cache_states(look(live.url, cookies=sessions["acme"])) == ["hit"] * 3
    finally:
        registry.close()
        live.stop()
