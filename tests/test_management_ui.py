"""RabbitMQ 3.10's own management UI, in headless Chromium, against a real HareMQ node: the UI's
static files are served from a loopback port of their own that hands `/api/` on to the node's
management port (tests/ui_proxy.py), as an operator would put that UI in front of HareMQ.

It signs in as guest/guest and makes 17 checks, each that a page rendered (the UI says
"Refreshed ...") without the UI's error box (its debug box, where a template that reads a field
the API did not send throws, or a warning popup, or its "Not found" page): fifteen pages
(overview, connections, channels, exchanges, one exchange, queues, one queue, users, one user,
vhosts, one vhost, policies, limits, feature flags, one node), then adding a queue, and
publishing to it and getting the message back, all through the UI's forms.

The UI's files come with Debian's rabbitmq-server package (never started here); CI machines do
not have it, so the test skips without them. HAREMQ_MGMT_UI_DIR names another copy (a `priv/www`
of rabbitmq_management). A screenshot of the overview goes to the test's tmp dir."""
from __future__ import annotations

import glob
import os
from pathlib import Path

import pika
import pytest

from tests.browser import chromium, needs_chromium
from tests.conftest import IS_REF, unique_name, wait_until
from tests.management import ManagedNode, q
from tests.ui_proxy import UIProxy

try:
    from selenium.common.exceptions import WebDriverException
except ImportError:       # pragma: no cover - selenium is a test dependency (needs_chromium skips)
    WebDriverException = Exception  # type: ignore[misc,assignment]

DEBIAN_UI = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www"


def ui_dir() -> Path | None:
    given = os.environ.get("HAREMQ_MGMT_UI_DIR")
    candidates = [given] if given else sorted(glob.glob(DEBIAN_UI), reverse=True)
    for candidate in candidates:
        www = Path(candidate)
        if (www / "index.html").is_file() and (www / "js" / "dispatcher.js").is_file():
            return www
    return None


UI = ui_dir()
pytestmark = [
    pytest.mark.skipif(IS_REF, reason="starts its own node with the management API"),
    pytest.mark.skipif(UI is None, reason="RabbitMQ's management UI files are not here (Debian's rabbitmq-server "
                       "package has them; or set HAREMQ_MGMT_UI_DIR to a rabbitmq_management priv/www)"),
    *needs_chromium,
]

# One script call reads the page's state: what the UI rendered last, and what it complained of.
STATE_JS = """
const text = sel => Array.from(document.querySelectorAll(sel)).map(e => e.textContent.trim()).join(' | ');
return {status: text('#status'), h1: text('#main h1'), debug: text('#debug'),
        warn: text('.form-popup-warn'), info: text('.form-popup-info'), login: text('#login-status'),
        msgs: text('#msg-wrapper'),
        template: typeof current_template === 'undefined' ? null : current_template};
"""
# Forget the last page's verdict (status line, error box, popups) before the next one.
RESET_JS = "$('#status').empty(); $('#debug').empty(); $('.form-popup-warn, .form-popup-info').remove();"
CHECKS = 17


@pytest.fixture
def world(tmp_path):
    """A node with something on every page: an exchange bound to a queue holding a message, and
    an open connection with a channel."""
    node = ManagedNode("hare-ui", tmp_path / "node").start()
    exchange, queue = unique_name("ui.x"), unique_name("ui.q")
    assert node.api("PUT", f"/api/exchanges/%2F/{q(exchange)}", {"type": "direct"})[0] == 201
    assert node.api("PUT", f"/api/queues/%2F/{q(queue)}", {"durable": True})[0] == 201
    assert node.api("POST", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(queue)}", {"routing_key": "k"})[0] == 201
    conn = pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0"))
    conn.channel().basic_publish(exchange, "k", b"seeded")
    proxy = UIProxy(UI, node.management_port).start()
    yield {"node": node, "exchange": exchange, "queue": queue, "ui": proxy.url}
    proxy.stop()
    conn.close()
    node.stop()


@pytest.fixture
def ui_browser(tmp_path):
    driver = chromium(tmp_path / "chromium-profile", console_log=True)
    yield driver
    driver.quit()


class Checks:
    """The 17 verdicts, kept in order; a failed one does not stop the others."""

    def __init__(self, driver):
        self.driver = driver
        self.results: list[tuple[str, bool, str]] = []

    def state(self) -> dict:
        return self.driver.execute_script(STATE_JS)

    def settled(self, done) -> dict:
        """The page's state once `done(state)` holds or the UI complained (15 s at most)."""
        try:
            return wait_until(lambda: (lambda s: s if done(s) or s["debug"] or s["warn"] else None)(self.state()),
                              15, 0.1)
        except AssertionError:
            return self.state()

    def record(self, name: str, ok: bool, state: dict) -> None:
        detail = ""
        if not ok:      # a page the browser's own dialog blocks does not answer for its console either
            errors = [] if "stopped" in state else [
                e["message"] for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]
            detail = f"{state} console: {errors[-3:]}"
        self.results.append((name, ok, detail))

    def page(self, name: str, hash_: str, heading: str) -> None:
        self.driver.execute_script(RESET_JS)
        self.driver.execute_script("location.hash = arguments[0];", hash_)
        state = self.settled(lambda s: s["status"].startswith("Refreshed") and s["h1"])
        ok = (state["status"].startswith("Refreshed") and not state["debug"] and not state["warn"]
              and heading in state["h1"] and "Not found" not in state["h1"])
        self.record(name, ok, state)

    def submit(self, form: str, fields: dict, done=lambda s: s["info"] or s["status"].startswith("Refreshed")) -> dict:
        """Fill and submit one of the page's forms (hidden sections included) as a user would."""
        self.driver.execute_script(RESET_JS)
        missing = self.driver.execute_script("""
            const form = document.querySelector(arguments[0]);
            if (form === null) return 'no form ' + arguments[0];
            for (const [name, value] of Object.entries(arguments[1])) form.elements[name].value = value;
            form.querySelector('input[type=submit]').click();
            return '';""", form, fields)
        if missing:
            return {**self.state(), "warn": missing}
        return self.settled(done)

    def summary(self) -> str:
        passed = sum(ok for _, ok, _ in self.results)
        lines = [f"{passed}/{CHECKS} checks pass"]
        lines += [f"  FAIL {name}: {detail}" for name, ok, detail in self.results if not ok]
        return "\n".join(lines)


def sign_in(driver, url: str) -> dict:
    """The page's state after signing in, or what stopped it (a browser's own password dialog, which
    an API's 401 with `WWW-Authenticate` raises, blocks the page: Selenium times out)."""
    driver.set_page_load_timeout(20)
    try:
        driver.get(url)
        wait_until(lambda: driver.find_elements("name", "username"), 15, 0.1)
        driver.find_element("name", "username").send_keys("guest")
        driver.find_element("name", "password").send_keys("guest")
        driver.find_element("css selector", "#login input[type=submit]").click()
        return Checks(driver).settled(lambda s: s["status"].startswith("Refreshed") and s["h1"] or s["login"])
    except (WebDriverException, AssertionError) as exc:
        return {"status": "", "h1": "", "debug": "", "warn": "", "stopped": str(exc).splitlines()[0]}


def test_rabbitmqs_management_ui_signs_in_and_works(world, ui_browser, tmp_path):
    driver, node, exchange, queue = ui_browser, world["node"], world["exchange"], world["queue"]
    checks = Checks(driver)
    state = sign_in(driver, world["ui"])
    ok = (state["status"].startswith("Refreshed") and "Overview" in state["h1"]
          and not state["debug"] and not state["warn"])
    checks.record("overview (signed in)", ok, state)
    if not ok:
        pytest.fail(checks.summary() + "\n(not signed in: the other 16 cannot be made)")
    driver.save_screenshot(str(tmp_path / "management-ui-overview.png"))

    for name, hash_, heading in [
            ("connections", "#/connections", "Connections"),
            ("channels", "#/channels", "Channels"),
            ("exchanges", "#/exchanges", "Exchanges"),
            ("one exchange", f"#/exchanges/%2F/{q(exchange)}", "Exchange: " + exchange),
            ("queues", "#/queues", "Queues"),
            ("one queue", f"#/queues/%2F/{q(queue)}", "Queue " + queue),
            ("users", "#/users", "Users"),
            ("one user", "#/users/guest", "User: guest"),
            ("vhosts", "#/vhosts", "Virtual Hosts"),
            ("one vhost", "#/vhosts/%2F", "Virtual Host: /"),
            ("policies", "#/policies", "Policies"),
            ("limits", "#/limits", "Limits"),
            ("feature flags", "#/feature-flags", "Feature Flags"),
            ("one node", f"#/nodes/{q(node.name)}", "Node " + node.name)]:
        checks.page(name, hash_, heading)

    # add a queue through the queues page's form
    added = unique_name("ui.added")
    checks.page("(queues, for the form)", "#/queues", "Queues")
    checks.results.pop()
    state = checks.submit('form[action="#/queues"][method="put"]', {"name": added})
    exists = node.api("GET", f"/api/queues/%2F/{q(added)}")[0] == 200
    checks.record("add a queue", exists and not state["debug"] and not state["warn"], {**state, "exists": exists})

    # publish to it from its page, and get the message back
    checks.page("(the added queue, for its forms)", f"#/queues/%2F/{q(added)}", "Queue " + added)
    checks.results.pop()
    published = checks.submit('form[action="#/exchanges/publish"]', {"payload": "hello from the UI"})
    state = checks.submit('form[action="#/queues/get"]', {"ackmode": "ack_requeue_false"},
                          done=lambda s: s["msgs"] or s["info"])
    ok = ("Message published" in published["info"] and "hello from the UI" in state["msgs"]
          and not published["warn"] and not state["warn"] and not state["debug"])
    checks.record("publish and get the message back", ok, {**state, "published": published})

    print(checks.summary())
    assert all(ok for _, ok, _ in checks.results), checks.summary()
    assert len(checks.results) == CHECKS
