"""The live web view in headless Chromium (Debian's chromium + chromium-driver, driven with
Selenium): the page signs in, shows three nodes and a mirrored queue's master; a node is
SIGKILLed and the same page, never reloaded, shows it down and the queue's new master.
A screenshot is saved as a test artifact ($HAREMQ_TEST_ARTIFACTS, default test-artifacts/)."""
from __future__ import annotations

import html
import http.server as http_server
import json
import os
import threading
from pathlib import Path

import pika
import pytest

from tests.browser import chromium, needs_chromium
from tests.conftest import IS_REF, PROJECT_ROOT, free_port, unique_name, wait_until
from tests.management import ManagedNode, http, q

try:
    from selenium.webdriver.common.by import By
except ImportError:       # pragma: no cover - selenium is a test dependency (needs_chromium skips)
    By = None  # type: ignore[misc,assignment]

pytestmark = [
    pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes"),
    pytest.mark.cluster(management=True),
    *needs_chromium,
]
ARTIFACTS = Path(os.environ.get("HAREMQ_TEST_ARTIFACTS", PROJECT_ROOT / "test-artifacts"))


@pytest.fixture
def browser(tmp_path):
    driver = chromium(tmp_path / "chromium-profile")
    yield driver
    driver.quit()


# read the page in one script call: it redraws its tables every second, so elements found
# in one call may be gone by the next
NODES_JS = "return Array.from(document.querySelectorAll('#nodes tbody tr')).map(r => [r.dataset.node, r.dataset.state]);"
QUEUES_JS = ("return Array.from(document.querySelectorAll('#queues tbody tr')).map(r => ({queue: r.dataset.queue, "
             "master: r.dataset.master, cells: Array.from(r.cells).map(c => c.textContent)}));")
FAILOVERS_JS = "return Array.from(document.querySelectorAll('#timeline li.failover')).map(li => li.textContent);"


def node_states(driver) -> dict:
    return dict(driver.execute_script(NODES_JS))


def queue_row(driver, name) -> dict | None:
    return next((r for r in driver.execute_script(QUEUES_JS) if r["queue"] == name), None)


def test_the_page_follows_a_failover_without_reloading(cluster, browser):
    hare1, hare2 = cluster["hare1"], cluster["hare2"]
    policy = {"pattern": "^ha\\.", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"},
              "apply-to": "queues"}
    assert http("PUT", hare1.management_port, "/api/policies/%2F/ha-all", policy)[0] == 201
    name = "ha." + unique_name("web")
    assert http("PUT", hare2.management_port, f"/api/queues/%2F/{q(name)}", {"durable": True})[0] == 201
    c = pika.BlockingConnection(pika.URLParameters(hare1.url))
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", name, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    c.close()

    browser.get(f"http://127.0.0.1:{hare1.management_port}/")
    browser.find_element(By.ID, "password").send_keys("guest")
    browser.find_element(By.ID, "signin").click()
    browser.execute_script("window.haremqNotReloaded = true;")

    wait_until(lambda: node_states(browser) == {"hare1": "up", "hare2": "up", "hare3": "up"}, 20, 0.2)

    def synced_on_hare2():
        row = queue_row(browser, name)
        if row is None or row["master"] != "hare2":
            return None
        return row["cells"] if sorted(row["cells"][4].split(", ")) == ["hare1", "hare3"] else None
    cells = wait_until(synced_on_hare2, 30, 0.2)
    assert cells[7] == "5"          # ready messages, counted by the home node
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "web-view-before-failover.png"))

    hare2.kill9()
    wait_until(lambda: node_states(browser).get("hare2") == "down", 20, 0.2)
    new_master = wait_until(lambda: (lambda r: r["master"] if r is not None and r["master"] in ("hare1", "hare3")
                                     else None)(queue_row(browser, name)), 30, 0.2)
    failover = wait_until(lambda: browser.execute_script(FAILOVERS_JS), 20, 0.2)
    assert f"master hare2 -> {new_master}" in failover[0]
    assert browser.execute_script("return window.haremqNotReloaded === true;")
    browser.save_screenshot(str(ARTIFACTS / "web-view-after-failover.png"))
    assert (ARTIFACTS / "web-view-after-failover.png").stat().st_size > 0


# ---- cross-site request forgery ----------------------------------------------------------------
@pytest.fixture
def mnode(tmp_path):
    node = ManagedNode("hare-web", tmp_path / "node").start()
    yield node
    node.stop()


@pytest.fixture
def attacker_site():
    """Another origin on loopback (another port), serving the pages the test sets."""
    pages: dict[str, str] = {}

    class Handler(http_server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http_server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield pages, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _forged_form(action: str, document: dict) -> str:
    """The classic text/plain form: one field whose name is the JSON up to a last string value
    and whose value closes it, so that the body is `name=value`, a JSON document."""
    text = json.dumps(document)
    assert text.endswith('"}')
    name, value = text[:-2] + '", "x": "', '"}'
    return ("<!doctype html><html><body>"
            f'<form id="f" method="POST" enctype="text/plain" action="{html.escape(action)}">'
            f'<input type="hidden" name="{html.escape(name)}" value="{html.escape(value)}">'
            "</form><script>document.getElementById('f').submit();</script></body></html>")


@pytest.mark.parametrize("credentials", ["cached", "in-url"])
def test_a_cross_origin_form_post_changes_nothing(mnode, attacker_site, browser, credentials):
    """A page on another origin makes the browser post a definitions document as a text/plain
    form to the API: with the API's basic auth cached by the browser (the user opened the API
    before), or given in the form's URL. No administrator is created either way."""
    pages, site = attacker_site
    api = f"http://127.0.0.1:{mnode.management_port}"
    name = unique_name("evil")
    document = {"users": [{"name": name, "password_hash": "", "tags": "administrator"}],
                "vhosts": [{"name": name}], "note": "forged"}
    if credentials == "cached":
        # a signed-in browser: it answered the API's basic auth challenge once and keeps the login
        browser.get(f"http://guest:guest@127.0.0.1:{mnode.management_port}/api/whoami")
        assert '"guest"' in browser.page_source
        action = api + "/api/definitions"
    else:
        action = f"http://guest:guest@127.0.0.1:{mnode.management_port}/api/definitions"
    pages["/"] = _forged_form(action, document)
    browser.get(site + "/")
    # the form went when the browser shows the API's answer (a refusal has a body to show; a
    # 204 leaves the browser on the page) or when the administrator exists
    created = lambda: mnode.api("GET", f"/api/users/{q(name)}")[0] == 200  # noqa: E731
    wait_until(lambda: f":{mnode.management_port}/" in browser.current_url or created(), 20, 0.2)
    assert not created(), "the forged form created an administrator"
    assert mnode.api("GET", f"/api/vhosts/{q(name)}")[0] == 404
    # and the web view, same browser, still signs in and reads the API
    browser.get(api + "/")
    browser.find_element(By.ID, "password").send_keys("guest")
    browser.find_element(By.ID, "signin").click()
    wait_until(lambda: browser.find_element(By.ID, "status").get_attribute("data-updated"), 20, 0.2)
