"""The hub in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright): search and browse with
JavaScript off, a hostile README that runs nothing with JavaScript on, a calibrated env's page and its uploaded
episodes (hostile ones included), and a private server's login.

Screenshots of the search results, a package page and an env card go to ``runs/hub-screenshots/``; the calibrated
env page to ``docs/hub-env-page.png`` (the README's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging_support import SUMMARY, publish, start_server

from env_registry.store.client import RegistryClient

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "runs" / "hub-screenshots"
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "hub-env-page.png"  # the README shows it
HOSTILE_TAG = "<script>window.__xss=1</script>"
# every element attribute a browser would run, and every link or source with a script or data URL
ACTIVE = """() => [...document.querySelectorAll('*')].flatMap(el => [...el.attributes]
    .filter(a => a.name.startsWith('on') || (['href', 'src', 'action', 'formaction', 'data'].includes(a.name)
        && /^\\s*(javascript|data|vbscript):/i.test(a.value)))
    .map(a => el.tagName + '[' + a.name + ']'))"""


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: apt-get install chromium (.ci/setup-machine.sh, which `make test` runs, does)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield browser
        browser.close()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)  # the team deployment; HTTP tests cover both
def test_search_and_browse_with_javascript_off(browser, server, hub_demo):
    publish(server, hub_demo["1.0.0"], hub_demo["1.1.0"])
    RegistryClient(server.url, server.token).publish_eval("hub-demo", "1.1.0", SUMMARY)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(java_script_enabled=False, viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.goto(f"{server.url}/")
    page.fill("input[name=q]", "demo")
    page.press("input[name=q]", "Enter")  # a plain GET form: no script involved
    page.wait_for_url("**/?q=demo")
    assert page.locator("#results").inner_text().startswith("1 result")
    page.screenshot(path=SCREENSHOTS / "search.png", full_page=True)

    page.click("a.name:has-text('hub-demo')")
    page.wait_for_url("**/packages/hub-demo")
    assert page.locator("#readme h1").inner_text() == "Hub demo"
    assert page.locator("#readme strong").inner_text() == "1.1.0"  # Markdown rendered
    versions = page.locator("table.versions tbody tr td:first-child").all_inner_texts()
    assert versions == ["1.1.0", "1.0.0"]
    assert "molt-env install hub/demo-v1@1.1.0" in page.locator("section.install").inner_text()
    page.screenshot(path=SCREENSHOTS / "package.png", full_page=True)

    page.click("dl.facts a:has-text('hub/demo-v1')")
    page.wait_for_url("**/envs/hub/demo-v1?version=1.1.0")
    assert page.locator("table.evals tbody tr").count() >= 1
    assert "runs/rl/hf" in page.locator("table.evals").inner_text()
    page.screenshot(path=SCREENSHOTS / "env-card.png", full_page=True)
    context.close()
    print(f"hub screenshots: {SCREENSHOTS}")


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_hostile_readme_executes_nothing(browser, server, hostile):
    publish(server, hostile)
    context = browser.new_context()  # JavaScript on: a payload that survived would run
    dialogs: list[str] = []
    context.on("page", lambda p: p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss())))

    probe = context.new_page()  # the probe itself: an unsanitized payload does run in this browser
    probe.set_content('<img src="x" onerror="window.__xss = 1">')
    probe.wait_for_function("window.__xss === 1")

    page = context.new_page()
    page.goto(f"{server.url}/packages/acme-hostile")
    readme = page.locator("#readme")
    assert readme.locator("strong").inner_text() == "bold" and readme.locator("table").count() == 1
    page.hover("text=hover me")
    page.click("details summary")
    page.click("text=press")
    assert page.url.endswith("/packages/acme-hostile")  # the sanitized form posted nowhere
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.evaluate(ACTIVE) == []
    tags = "script, iframe, object, embed, style, form, input, meta[http-equiv], base, svg"
    assert readme.locator(tags).count() == 0

    # the sanitizer alone, without the page's Content-Security-Policy: the README's HTML still runs nothing
    bare = context.new_page()
    bare.set_content(f"<html><body>{readme.inner_html()}</body></html>")
    bare.hover("text=hover me")
    assert bare.evaluate("typeof window.__xss") == "undefined" and bare.evaluate(ACTIVE) == []

    card = context.new_page()
    card.goto(f"{server.url}/envs/acme/hostile-v1")
    assert "<script>window.__xss=1</script>" in card.locator("p.summary").inner_text()  # shown as text
    assert card.evaluate("typeof window.__xss") == "undefined"
    assert dialogs == []
    context.close()


@pytest.fixture
def own_server(tmp_path):
    """``molt-env serve`` (SQLite) over a registry of this test's alone."""
    live = start_server(tmp_path / "registry")
    yield live
    live.stop()


def test_an_env_page_with_calibration_and_its_uploaded_episodes(browser, own_server, hub_versions, tmp_path):
    """The env page of a calibrated env with two versions and an uploaded eval, screenshotted for the README
    (``docs/hub-env-page.png``); then into the eval's episodes, whose hostile text runs nothing (JavaScript on).
    A server of its own (SQLite), so that the screenshot shows this test's data only."""
    from test_hub_versions import ENV, ENV_SUMMARY, PACKAGE, REWARDS, calibrate, episodes

    server = own_server
    publish(server, hub_versions["1.0.0"], hub_versions["1.1.0"])
    for version, rewards in REWARDS.items():
        calibrate(server, version, rewards)
    client = RegistryClient(server.url, server.token)
    record = client.publish_eval(PACKAGE, "1.1.0", {**SUMMARY, **ENV_SUMMARY})
    (tmp_path / "samples.jsonl").write_bytes(episodes(24))
    client.publish_eval_samples(PACKAGE, "1.1.0", record.id, tmp_path / "samples.jsonl")

    context = browser.new_context(viewport={"width": 1100, "height": 900})  # JavaScript on
    dialogs: list[str] = []
    context.on("page", lambda p: p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss())))
    page = context.new_page()
    page.goto(f"{server.url}/envs/{ENV}?version=1.1.0")
    assert page.locator("table.versions tbody tr td:first-child").all_inner_texts() == ["1.1.0", "1.0.0"]
    assert page.locator("svg.passk circle.point").count() == 4 and page.locator("#changes table.diff").is_visible()
    assert page.locator("#changes tr.changed").count() == 3
    page.screenshot(path=DOCS_SCREENSHOT, full_page=True)
    assert DOCS_SCREENSHOT.read_bytes().startswith(b"\x89PNG")

    page.click(f"a.episodes[href='/evals/{record.id}/']")
    page.wait_for_url(f"**/evals/{record.id}/")
    assert page.locator("table.episodes tbody tr").count() == 24
    page.click(f"a[href='/evals/{record.id}/episodes/7']")  # an episode full of script
    assert HOSTILE_TAG in page.locator("ol.transcript").inner_text()  # shown as text
    assert page.evaluate("typeof window.__xss") == "undefined" and page.evaluate(ACTIVE) == []
    page.click("#back a")
    page.wait_for_url(f"**/envs/{ENV}?version=1.1.0#evals")
    assert dialogs == []
    context.close()


def test_a_private_server_refuses_pages_without_the_cookie(browser, private_server):
    context = browser.new_context()
    page = context.new_page()
    response = page.goto(f"{private_server.url}/packages/acme-echo")
    assert response.status == 401 and page.locator("form.login").count() == 1
    context.add_cookies([{"name": "molt_session", "value": "forged", "url": private_server.url}])
    assert page.goto(f"{private_server.url}/").status == 401
    page.goto(f"{private_server.url}/login?next=/%3Fq%3Decho")
    page.fill("input[name=token]", "molt_wrong")
    page.click("form.login button")
    assert "unknown or revoked" in page.locator("#login-error").inner_text()
    page.fill("input[name=token]", private_server.token)
    page.click("form.login button")
    page.wait_for_url("**/?q=echo")
    assert page.locator("#results").count() == 1 and page.locator("span.viewer").inner_text() == "acme"
    cookie = next(c for c in context.cookies() if c["name"] == "molt_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "molt_session" not in page.evaluate("document.cookie")  # scripts never see the session
    other = browser.new_context()
    assert other.new_page().goto(f"{private_server.url}/").status == 401  # the cookie is the login, nothing else
    page.click("nav button:has-text('Log out')")
    assert page.goto(f"{private_server.url}/").status == 401
    other.close()
    context.close()
