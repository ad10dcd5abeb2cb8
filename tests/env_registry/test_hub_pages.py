"""The hub's pages and eval-summary API over HTTP, on both backends: search, the package page, the env card,
install counts, login sessions, and what hostile input gets (4xx or inert output, never a 5xx)."""

from __future__ import annotations

import html
import json
import re
import sqlite3
import time
from html.parser import HTMLParser
from urllib.parse import quote

import httpx
import psycopg
import pytest
from packaging_support import SUMMARY, hatch_build, hatch_files, publish

from env_registry.hub.pages import templates
from env_registry.packages.scaffold import init
from env_registry.store.client import RegistryClient
from env_registry.store.eval_summaries import InvalidSummary
from env_registry.store.local import Forbidden, NotFound


def sql(server, statement: str, *args) -> None:
    """Run one statement on the server's database (what a later validation gate, or time, would change), advancing
    the content stamp as the registry's own writes do (the cached pages depend on it)."""
    bump = "UPDATE changes SET content = content + 1 WHERE id = 1"
    if server.db is None:
        with sqlite3.connect(server.root / "registry.db") as db:
            db.execute(statement, args)
            db.execute(bump)
    else:
        with psycopg.connect(server.db) as db:
            db.execute(statement.replace("?", "%s"), args)
            db.execute(bump)


class ActiveContent(HTMLParser):
    """Everything in a page that a browser could run: script elements, event handlers, script/data URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "iframe", "object", "embed", "base", "meta", "style") and not (
            tag == "meta" and dict(attrs).keys() <= {"charset", "name", "content"} and "http-equiv" not in dict(attrs)
        ):
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            value = re.sub(r"\s", "", (value or "")).lower()
            if name.startswith("on") or name in ("style", "formaction", "srcdoc"):
                self.found.append(f"{tag}[{name}]")
            if name in ("href", "src", "action", "data") and value.startswith(("javascript:", "data:", "vbscript:")):
                self.found.append(f"{tag}[{name}={value[:30]}]")


def active_content(page: str) -> list[str]:
    parser = ActiveContent()
    parser.feed(page)
    return parser.found


def test_search_tags_newest_and_most_installed(server, hub_demo, echo):
    publish(server, hub_demo["1.0.0"], hub_demo["1.1.0"], echo.releases["1.0.0"])
    home = httpx.get(f"{server.url}/")
    assert home.status_code == 200 and "Newest" in home.text and "Most installed" in home.text
    assert 'href="/packages/hub-demo"' in home.text and 'href="/?tag=single-turn"' in home.text
    for query in ("hub-demo", "HUB/DEMO-V1", "repeat the given TEXT", "single-turn"):  # name, env ID, description, tag
        found = httpx.get(f"{server.url}/", params={"q": query})
        assert found.status_code == 200 and 'href="/packages/hub-demo"' in found.text, query
    tagged = httpx.get(f"{server.url}/", params={"tag": "echo", "q": "hub"})
    assert 'href="/packages/hub-demo"' in tagged.text and 'href="/packages/acme-echo"' not in tagged.text
    nothing = httpx.get(f"{server.url}/", params={"q": "no-such-env-anywhere"})
    assert "0 results" in nothing.text and "Nothing matches" in nothing.text


@pytest.mark.parametrize(
    "query",
    ["' OR 1=1 --", '"; DROP TABLE packages; --', "%", "_", "\\", "%' UNION SELECT digest FROM tokens --", "\x00"],
)
def test_search_with_sql_metacharacters_is_harmless(server, hub_demo, query):
    publish(server, hub_demo["1.0.0"])
    before = httpx.get(f"{server.url}/api/packages").json()
    page = httpx.get(f"{server.url}/", params={"q": query})
    api = httpx.get(f"{server.url}/api/search", params={"q": query})
    assert page.status_code == 200 and api.status_code == 200, (page.status_code, api.status_code)
    # matched as plain text (no wildcard, no SQL): exactly the packages whose searchable text holds the characters
    expected = [p["name"] for p in before if any(query.lower() in text.lower() for text in searchable(p))]
    assert [p["name"] for p in api.json()] == expected
    assert f"{len(expected)} result" in page.text
    assert "molt_" not in page.text and httpx.get(f"{server.url}/api/packages").json() == before


def searchable(package: dict) -> list[str]:
    texts = [package["name"], *package["env_ids"]]
    for release in package["releases"]:
        texts += [release["summary"], *(m.get("description", "") for m in release["manifests"])]
        texts += [t for m in release["manifests"] for t in m.get("tags", [])]
    return texts


def test_package_page_versions_readme_install_and_hashes(server, hub_demo):
    publish(server, hub_demo["1.0.0"], hub_demo["1.1.0"])
    client = RegistryClient(server.url, server.token)
    client.yank("hub-demo", "1.0.0", "reward off by one <b>really</b>")
    page = httpx.get(f"{server.url}/packages/hub-demo")
    assert page.status_code == 200
    text = page.text
    assert "<strong>1.1.0</strong>" in text  # the README, rendered from Markdown
    assert "yanked: reward off by one &lt;b&gt;really&lt;/b&gt;" in text  # the reason, escaped
    assert "Apache-2.0" in text and ">acme<" in text  # license and owner
    assert f"molt-env install hub/demo-v1@1.1.0 --registry {server.url}" in text
    assert f"pip install --index-url {server.url}/p/hub-demo/simple/ --no-deps hub-demo==1.1.0" in text
    for file in client.package("hub-demo").releases[-1].files:
        assert file.sha256 in text and f'href="/files/hub-demo/{file.filename}"' in text
    old = httpx.get(f"{server.url}/packages/hub-demo", params={"version": "1.0.0"})
    assert "This version is yanked" in old.text and "<strong>1.0.0</strong>" in old.text
    assert httpx.get(f"{server.url}/packages/Hub_Demo", follow_redirects=False).headers["location"] == (
        "/packages/hub-demo"
    )
    assert page.headers["content-security-policy"].startswith("default-src 'none'")


def test_install_counts_are_wheel_downloads_per_version(server, hub_demo):
    publish(server, hub_demo["1.0.0"], hub_demo["1.1.0"])
    release = RegistryClient(server.url).package("hub-demo").releases[-1]
    start = release.downloads
    for file in release.files:  # one wheel and one sdist download
        assert httpx.get(f"{server.url}/{file.url}").status_code == 200
    assert httpx.get(f"{server.url}/{release.wheel.url}").status_code == 200
    after = RegistryClient(server.url).package("hub-demo").releases[-1]
    assert after.downloads == start + 2  # only wheels count
    assert f"{after.downloads} of this version" in httpx.get(f"{server.url}/packages/hub-demo").text


def test_env_card_shows_the_manifest_validation_and_eval_summaries(server, hub_demo):
    publish(server, hub_demo["1.0.0"], hub_demo["1.1.0"])
    client = RegistryClient(server.url, server.token)
    stored = client.publish_eval("hub-demo", "1.1.0", SUMMARY)
    assert stored.publisher == "acme" and stored.summary["report"] == SUMMARY["report"]
    assert stored.id in [e.id for e in client.evals("hub-demo", "1.1.0")]
    card = httpx.get(f"{server.url}/envs/hub/demo-v1")
    assert card.status_code == 200
    for shown in ("env", "text", "[0.0, 1.0]", "Apache-2.0", "data/train.jsonl", "input_key", "Not validated yet"):
        assert shown in card.text, shown
    assert "0.625" in card.text and "runs/rl/hf" in card.text and "grader_error: 1, timeout: 2" in card.text
    assert "pass@4" in card.text and "0123456789abcdef" in card.text
    assert 'href="/envs/hub/demo-v1?version=1.0.0"' in card.text  # the other version of the ID
    sql(
        server,
        "UPDATE releases SET validation_status = ?, validation_report = ? WHERE package = ? AND version = ?",
        "passed",
        json.dumps(
            {"isolation": "jail", "checks": [{"name": "determinism", "passed": True, "detail": "", "env_id": None}]}
        ),
        "hub-demo",
        "1.1.0",
    )
    card = httpx.get(f"{server.url}/envs/hub/demo-v1").text
    assert 'class="status passed"' in card and "determinism" in card
    assert "None yet: the publish gate" in card  # this report has no sample prompts
    assert "<pre>Repeat the following text exactly and write nothing else:\n{input}</pre>" in card  # the template
    as_read = templates.env.filters["template"]  # the template as the model reads it: str.format's {{ }} undone
    assert (
        as_read("{input}\nPut your final answer within \\boxed{{}}.")
        == "{input}\nPut your final answer within \\boxed{}."
    )
    assert httpx.get(f"{server.url}/envs/hub/demo-v1", params={"version": "1.0.0"}).text.count("No eval summary") == 1
    assert httpx.get(f"{server.url}/envs/hub/demo-v9").status_code == 404


def test_eval_summary_uploads_are_checked(server, hub_demo):
    publish(server, hub_demo["1.1.0"])
    url = f"{server.url}/api/packages/hub-demo/1.1.0/evals"
    auth = {"Authorization": f"Bearer {server.token}"}
    assert httpx.post(url, json=SUMMARY).status_code == 401
    assert httpx.post(url, json=SUMMARY, headers={"Authorization": "Bearer molt_forged"}).status_code == 403
    bad = {
        "missing key": {k: v for k, v in SUMMARY.items() if k != "spec_hash"},
        "no pass@k": {k: v for k, v in SUMMARY.items() if not k.startswith("pass@")},
        "k > n": {**SUMMARY, "pass@8": 0.5},
        "pass@0": {**SUMMARY, "pass@0": 0.5},
        "fraction": {**SUMMARY, "pass@1": 1.5},
        "pinned id": {**SUMMARY, "env_id": "hub/demo-v1@1.1.0"},
    }
    for why, summary in bad.items():
        response = httpx.post(url, json=summary, headers=auth)
        assert response.status_code == 400 and "not an eval summary" in response.json()["detail"], why
    for body in (b"[1, 2]", b"{not json", json.dumps(SUMMARY).replace("0.41", "NaN").encode()):
        response = httpx.post(url, content=body, headers={**auth, "Content-Type": "application/json"})
        assert response.status_code == 400, body
    huge = httpx.post(url, json={**SUMMARY, "notes": "x" * 300_000}, headers=auth)
    assert huge.status_code == 413 and "at most" in huge.json()["detail"]
    wrong_version = httpx.post(url, json={**SUMMARY, "package_version": "1.0.0"}, headers=auth)
    assert wrong_version.status_code == 409 and "upload it to that version" in wrong_version.json()["detail"]
    wrong_env = httpx.post(url, json={**SUMMARY, "env_id": "acme/echo-v1"}, headers=auth)
    assert wrong_env.status_code == 409 and "not 'acme/echo-v1'" in wrong_env.json()["detail"]
    assert httpx.post(url.replace("1.1.0", "9.9.9"), json=SUMMARY, headers=auth).status_code == 404
    with pytest.raises(Forbidden, match="needs a token"):
        RegistryClient(server.url).publish_eval("hub-demo", "1.1.0", SUMMARY)
    with pytest.raises(InvalidSummary, match="pass@<k>"):  # checked before anything is sent
        RegistryClient(server.url, server.token).publish_eval("hub-demo", "1.1.0", bad["k > n"])
    with pytest.raises(NotFound):
        RegistryClient(server.url).evals("hub-demo", "7.0.0")


def test_a_hostile_readme_and_manifest_arrive_inert(server, hostile):
    publish(server, hostile)
    for path in ("/packages/acme-hostile", "/envs/acme/hostile-v1", "/?q=hostile", "/"):
        page = httpx.get(server.url + path)
        assert page.status_code == 200, path
        assert active_content(page.text) == [], (path, active_content(page.text))
    readme = httpx.get(f"{server.url}/packages/acme-hostile").text
    assert "<strong>bold</strong>" in readme and "<table>" in readme  # Markdown still renders
    assert 'href="https://example.com/docs" rel="nofollow noopener noreferrer"' in readme


def test_readmes_past_the_limits(server, tmp_path):
    src = init(tmp_path / "huge", "acme/huge-readme-v1")
    (src / "README.md").write_text("# Huge\n" + "<script>window.__xss=1</script> and text\n" * 250_000)  # ~10 MB
    wheel, sdist = hatch_files(src, tmp_path / "d1")
    refused = httpx.post(
        f"{server.url}/api/packages",
        files={"wheel": (wheel.name, wheel.read_bytes()), "sdist": (sdist.name, sdist.read_bytes())},
        headers={"Authorization": f"Bearer {server.token}"},
    )
    assert refused.status_code == 400 and "METADATA is larger than 1048576 bytes" in refused.json()["detail"]
    src = init(tmp_path / "long", "acme/long-readme-v1")
    (src / "README.md").write_text("# Long\n" + "<img src=x onerror=window.__xss=1> *text*\n" * 4000)  # ~170 KB
    publish(server, hatch_build(src, tmp_path / "d2"))
    page = httpx.get(f"{server.url}/packages/acme-long-readme")
    assert page.status_code == 200 and "<pre>" in page.text and "&lt;img src=x onerror" in page.text
    assert active_content(page.text) == []


@pytest.mark.parametrize(
    "path",
    [
        "/packages/%2E%2E",
        "/packages/..%2F..%2Fregistry.db",
        "/packages/acme%3Becho",
        "/packages/%00",
        "/packages/hub-demo?version=..%2F..%2Fetc",
        "/packages/hub-demo?version=%00",
        "/packages/hub-demo?version=1.0%2Bevil",
        "/envs/%2E%2E/%2E%2E/registry.db",
        "/envs/hub/..%2F..%2Fregistry.db",
        "/envs/hub/demo-v1?version=..%2F..",
        "/envs/hub/demo-v1@1.0.0",
        "/envs/" + "a" * 5000,
        "/?q=" + "x" * 10_000,
        "/?tag=" + "t" * 300,
        "/?q=%FF%FE",
        "/login?next=%2F%2Fevil.example%2F",
        "/static/..%2Fstore.py",
        "/static/%2E%2E/%2E%2E/registry.db",
        "/api/packages/hub-demo/%2E%2E/evals",
        "/api/packages/%2E%2E/1.0/evals",
    ],
)
def test_odd_paths_and_parameters_are_4xx_or_harmless(server, hub_demo, path):
    publish(server, hub_demo["1.0.0"])
    response = httpx.get(server.url + path, follow_redirects=False)
    assert response.status_code < 500, (path, response.status_code, response.text[:300])
    assert response.status_code >= 400 or path.startswith(("/?q=%FF", "/login")), (path, response.status_code)
    assert b"SQLite" not in response.content and b"import " not in response.content  # no file of the server leaks
    if path.startswith("/login"):
        assert 'value="/"' in response.text  # a login never returns to another site


def test_private_pages_need_a_session_cookie(private_server):
    url = private_server.url
    for path in ("/", "/packages/acme-echo", "/envs/acme/echo-v1", "/?q=echo"):
        refused = httpx.get(url + path)
        assert refused.status_code == 401 and 'action="/login"' in refused.text, path
    forged = httpx.get(f"{url}/", cookies={"molt_session": "forged-value"})
    assert forged.status_code == 401
    wrong = httpx.post(f"{url}/login", data={"token": "molt_not-a-token", "next": "/"})
    assert wrong.status_code == 403 and "unknown or revoked" in wrong.text
    login = httpx.post(f"{url}/login", data={"token": private_server.token, "next": "/?q=echo"})
    assert login.status_code == 303 and login.headers["location"] == "/?q=echo"
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=43200" in cookie
    session = login.cookies["molt_session"]
    assert httpx.get(f"{url}/", cookies={"molt_session": session}).status_code == 200
    assert httpx.get(f"{url}/api/packages", cookies={"molt_session": session}).status_code == 200  # reads, as a token
    upload = httpx.post(f"{url}/api/packages", cookies={"molt_session": session}, files={"wheel": ("a.whl", b"x")})
    assert upload.status_code == 401  # a session never publishes: that needs the token itself
    assert httpx.get(f"{url}/", headers={"Authorization": f"Bearer {private_server.token}"}).status_code == 200
    sql(private_server, "UPDATE sessions SET expires = ?", time.time() - 1)  # the session expires
    assert httpx.get(f"{url}/", cookies={"molt_session": session}).status_code == 401
    again = httpx.post(f"{url}/login", data={"token": private_server.token}).cookies["molt_session"]
    out = httpx.post(f"{url}/logout", cookies={"molt_session": again})
    assert out.status_code == 303 and 'molt_session=""' in out.headers["set-cookie"]
    assert httpx.get(f"{url}/", cookies={"molt_session": again}).status_code == 401  # the session is gone


def test_other_ecosystems_envs_get_cards_and_a_catalog_page(server):
    """``rg:``/``gym:`` IDs installed on the server: a card with the source, upstream version, license and the prompts
    as the model sees them; a catalog page per scheme; unknown names, URLs and schemes are 4xx, never fetched."""
    from importlib.metadata import version

    from reasoning_gym.factory import DATASETS

    import env_registry
    from env_registry.datasets import load_split
    from env_registry.hub import ecosystem_cards

    index = httpx.get(server.url + "/", timeout=60).text
    assert 'href="/sources/rg"' in index and 'href="/sources/textarena"' in index

    page = httpx.get(server.url + "/envs/rg:countdown", timeout=60)
    assert page.status_code == 200, page.text[:500]
    facts = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]*)</dd>", page.text))
    assert facts["Source ecosystem"] == "rg" and facts["License"] == "Apache-2.0"
    assert facts["Upstream library"].split() == ["reasoning-gym", version("reasoning-gym")]
    first = load_split(env_registry.spec("rg:countdown"), "test", 1)[0]["prompt"][-1]["content"]
    assert html.escape(first.splitlines()[0], quote=False) in page.text  # the test split's first prompt, escaped
    assert env_registry.spec("rg:countdown").hash in page.text and active_content(page.text) == []

    game = httpx.get(server.url + "/envs/gym:FrozenLake-v1", timeout=60).text
    assert "gymnasium" in game and version("gymnasium") in game and "FrozenLake-v1 episode 0" in game  # rows: seeds

    listing = httpx.get(server.url + "/sources/rg", timeout=60)
    assert listing.status_code == 200
    assert set(re.findall(r"<code>(rg:[^<]+)</code>", listing.text)) == {f"rg:{n}" for n in DATASETS}

    wrong = httpx.get(server.url + "/envs/rg:countdwn", timeout=60)
    assert wrong.status_code == 404 and "countdown" in wrong.text  # did you mean
    url = httpx.get(server.url + "/envs/openenv:" + quote("http://127.0.0.1:9/", safe=""), timeout=60)
    assert 400 <= url.status_code < 500  # no route takes a URL's slashes; were one to, the card refuses it:
    with pytest.raises(ecosystem_cards.NotAnEcosystemCard, match="never fetches"):
        ecosystem_cards.card("openenv:http://127.0.0.1:9/")
    assert httpx.get(server.url + "/sources/nope", timeout=60).status_code == 404
    assert httpx.get(server.url + "/envs/rg:countdown?version=1", timeout=60).status_code == 400
