"""BlazeDB Studio in a real browser (Debian's chromium through selenium): two daemons syncing, `blazectl studio` on
the first, and a page that browses, watches, edits, resolves a conflict and revokes a member; a page with a bad
token is refused. Screenshots go to $STUDIO_SCREENSHOTS (default .build/studio-screenshots)."""
import base64
import json
import os
import re
import select
import socket
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import blazedb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BLAZE_BUILD") or os.path.join(ROOT, ".build", "debug")
SHOTS = os.environ.get("STUDIO_SCREENSHOTS") or os.path.join(ROOT, ".build", "studio-screenshots")
DEADLINE = 60


def eventually(check, what, seconds=DEADLINE):
    """Polls `check` until it returns something truthy (returned) or the deadline passes (the test fails)."""
    end = time.monotonic() + seconds
    last = None
    while time.monotonic() < end:
        try:
            last = check()
            if last:
                return last
        except (blazedb.BlazeError, NoSuchElementException, StaleElementReferenceException) as e:
            last = e
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what} (last: {last!r})")


def read_until(proc, pattern, log, seconds=DEADLINE):
    """Reads `proc`'s output until a line matches `pattern`; returns the match."""
    end = time.monotonic() + seconds
    while True:
        m = re.search(pattern, log[0])
        if m:
            return m
        remaining = end - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            pytest.fail(f"no {pattern!r} in: {log[0]}")
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            log[0] += chunk.decode(errors="replace")


class Daemon:
    """A blazed with a sync listener on loopback, in a temporary directory."""

    def __init__(self, name):
        self.dir = tempfile.mkdtemp(prefix=f"blazestudio-{name}-")
        self.socket = os.path.join(self.dir, "blazed.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLAZEDB_")}
        env["XDG_CONFIG_HOME"] = os.path.join(self.dir, "config")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "blazed"), "--socket", self.socket, "--data-dir", os.path.join(self.dir, "data"),
             "--sync-listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        self.log = [""]
        read_until(self.proc, r"Listening", self.log)
        self.client = blazedb.Client(self.socket)

    def call(self, method, **params):
        return self.client.call(method, params)

    def stop(self):
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def world():
    a, b = Daemon("a"), Daemon("b")
    studio = None
    browser = None
    try:
        a.call("db.create", db="team")
        a.call("db.share", db="team")
        token = a.call("db.invite", db="team", role="writer")["token"]
        b.call("db.join", token=token, db="team")
        b.call("peer.add", db="team", address=a.call("sync.status")["listen"])
        a.call("doc.put", db="team", collection="notes", id="n1", doc={"title": "first", "address": {"street": "Main"}})
        eventually(lambda: b.call("doc.get", db="team", collection="notes", id="n1"), "n1 on B")
        studio = subprocess.Popen(
            [os.path.join(BUILD, "blazectl"), "studio", "--socket", a.socket],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        log = [""]
        url = read_until(studio, r"open (http://\S+)", log).group(1)
        options = webdriver.ChromeOptions()
        for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"]:
            options.add_argument(arg)
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"))
        os.makedirs(SHOTS, exist_ok=True)
        yield {"a": a, "b": b, "url": url, "browser": browser}
    finally:
        if browser:
            browser.quit()
        if studio and studio.poll() is None:
            studio.send_signal(signal.SIGINT)
            try:
                studio.wait(timeout=30)
            except subprocess.TimeoutExpired:
                studio.kill()
                studio.wait()
        a.stop()
        b.stop()


def shot(browser, name):
    path = os.path.join(SHOTS, f"{name}.png")
    browser.save_screenshot(path)
    print(f"screenshot: {path}")


def stats(browser):
    return browser.execute_script("return window.studioStats")


def click_tab(browser, name):
    browser.find_element(By.CSS_SELECTOR, f'#tabs button[data-tab="{name}"]').click()


def open_studio(world):
    browser = world["browser"]
    # From another document first: a change of fragment alone would not load the page again.
    browser.get("about:blank")
    browser.get(world["url"])
    eventually(lambda: stats(browser)["connected"], "the page to connect")
    return browser


def click(browser, selector, what):
    """Finds and clicks in one try, again until it works: tables are rebuilt as answers arrive."""
    eventually(lambda: browser.find_element(By.CSS_SELECTOR, selector).click() or True, what)


def choose(browser, db, collection):
    """Picks a collection in the Data tab: the other tabs work on its database."""
    click_tab(browser, "data")
    selector = f'#databases li[data-db="{db}"][data-collection="{collection}"]'
    # Found and clicked in one try: the list is rebuilt while it loads again.
    eventually(lambda: browser.find_element(By.CSS_SELECTOR, selector).click() or True, f"{db}/{collection} in the list")
    eventually(lambda: browser.find_element(By.CSS_SELECTOR, selector + ".selected"), f"{db}/{collection} chosen")


def test_a_page_with_a_bad_token_is_refused(world):
    browser = world["browser"]
    bad = re.sub(r"token=.*", "token=not-the-token", world["url"])
    browser.get(bad)
    eventually(lambda: stats(browser)["refused"], "the refusal")
    assert "refused" in browser.find_element(By.ID, "status").text
    assert not stats(browser)["connected"]
    assert browser.find_element(By.ID, "databases").text == ""
    shot(browser, "refused")


def test_live_view_and_a_nested_edit_reach_the_second_daemon(world):
    a, b = world["a"], world["b"]
    browser = open_studio(world)
    choose(browser, "team", "notes")
    eventually(lambda: browser.find_element(By.CSS_SELECTOR, '#docs tr[data-id="n1"]'), "n1 in the document table")
    click_tab(browser, "live")
    browser.find_element(By.ID, "live-start").click()
    eventually(lambda: browser.find_element(By.ID, "live-stop").is_enabled(), "the subscription")
    # Another client writes: the page shows it.
    with blazedb.Client(a.socket) as other:
        other.call("doc.insert", {"db": "team", "collection": "notes", "doc": {"_id": "live-1", "title": "from elsewhere"}})
    eventually(lambda: browser.find_elements(By.CSS_SELECTOR, '#live-events tr[data-id="live-1"]'), "live-1 in the live view")
    # A write on the other device arrives by sync and shows too.
    b.call("doc.insert", db="team", collection="notes", doc={"_id": "from-b", "title": "written on B"})
    eventually(lambda: browser.find_elements(By.CSS_SELECTOR, '#live-events tr[data-id="from-b"]'), "B's write in the live view")
    shot(browser, "live")
    # Edit a nested field in the editor; it reaches B.
    click_tab(browser, "data")
    click(browser, '#docs tr[data-id="n1"]', "n1 again")
    eventually(lambda: '"street"' in browser.find_element(By.ID, "ed-doc").text, "the editor")
    browser.find_element(By.ID, "p-path").send_keys("address.city")
    browser.find_element(By.ID, "p-value").send_keys('"Paris"')
    browser.find_element(By.CSS_SELECTOR, "#patch button").click()
    eventually(lambda: '"Paris"' in browser.find_element(By.ID, "ed-doc").text, "the edit in the editor")
    doc = eventually(lambda: (lambda d: d if d["address"].get("city") == "Paris" else None)(
        b.call("doc.get", db="team", collection="notes", id="n1")["doc"]), "the edit on B")
    assert doc["address"] == {"street": "Main", "city": "Paris"}
    # A bad patch shows the daemon's error.
    browser.find_element(By.ID, "p-path").clear()
    browser.find_element(By.ID, "p-path").send_keys("title")
    browser.find_element(By.ID, "p-value").clear()
    browser.find_element(By.ID, "p-value").send_keys("5")
    browser.find_element(By.ID, "p-op").send_keys("incr")
    browser.find_element(By.CSS_SELECTOR, "#patch button").click()
    eventually(lambda: "not_a_number" in browser.find_element(By.ID, "p-error").text, "the validation error")
    shot(browser, "data")


def test_a_documents_history_shows_each_change_and_a_diff(world):
    browser = open_studio(world)
    choose(browser, "team", "notes")
    click(browser, '#docs tr[data-id="n1"]', "n1")
    eventually(lambda: browser.find_element(By.ID, "ed-history").is_displayed(), "the editor")
    browser.find_element(By.ID, "ed-history").click()
    entries = eventually(lambda: browser.find_elements(By.CSS_SELECTOR, "#h-entries li"), "the history entries")
    assert len(entries) >= 2, [e.text for e in entries]
    entries[0].click()
    eventually(lambda: '"street"' in browser.find_element(By.ID, "h-state").text, "the first state")
    assert "Paris" not in browser.find_element(By.ID, "h-state").text
    entries[0].find_element(By.TAG_NAME, "input").click()
    entries[-1].find_element(By.TAG_NAME, "input").click()
    browser.find_element(By.ID, "h-diff").click()
    eventually(lambda: "+ address.city: \"Paris\"" in browser.find_element(By.ID, "h-diffout").text, "the diff")
    shot(browser, "history")


def test_the_performance_page_shows_the_daemons_metrics(world):
    browser = open_studio(world)
    choose(browser, "team", "notes")
    click_tab(browser, "performance")
    eventually(lambda: "query.find" in browser.find_element(By.ID, "m-requests").text, "query.find in the request table")
    eventually(lambda: "over the last" in browser.find_element(By.ID, "m-summary").text, "a second reading with rates")
    assert "writes per group commit" in browser.find_element(By.ID, "m-other").text
    shot(browser, "performance")


def raw_http(port, request):
    """Sends one request; returns the status and the header block of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    head = answer.split(b"\r\n\r\n")[0].decode(errors="replace")
    status = int(head.split(" ")[1]) if head.startswith("HTTP/1.1 ") else 0
    return status, head.lower()


def test_the_bridge_wants_the_token_the_studios_own_origin_and_a_loopback_host(world):
    port = int(re.search(r":(\d+)/", world["url"]).group(1))
    token = world["url"].split("token=")[1]
    key = base64.b64encode(os.urandom(16)).decode()
    here = f"127.0.0.1:{port}"

    def upgrade(token, origin, host=here):
        return raw_http(port, f"GET /ws?token={token} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                              f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                              + (f"Origin: {origin}\r\n" if origin else "") + "\r\n")[0]
    assert upgrade(token, f"http://{here}") == 101
    assert upgrade(token, f"http://localhost:{port}", host=f"localhost:{port}") == 101
    assert upgrade("not-the-token", f"http://{here}") != 101
    assert upgrade("", f"http://{here}") != 101
    assert upgrade(token, None) != 101, "no Origin: not a page of the Studio's"
    assert upgrade(token, "http://evil.example") in (400, 403), "a page elsewhere"
    assert upgrade(token, f"http://evil.example:{port}", host=f"evil.example:{port}") in (400, 403), "DNS rebinding"
    status, head = raw_http(port, f"GET / HTTP/1.1\r\nHost: {here}\r\n\r\n")
    assert status == 200
    assert "frame-ancestors 'none'" in head and "x-frame-options: deny" in head and "referrer-policy: no-referrer" in head
    assert raw_http(port, f"GET / HTTP/1.1\r\nHost: attacker.example:{port}\r\n\r\n")[0] == 403
    assert raw_http(port, f"GET /check?token={token} HTTP/1.1\r\nHost: {here}\r\n\r\n")[0] == 204
    assert raw_http(port, f"GET /check?token=x{token} HTTP/1.1\r\nHost: {here}\r\n\r\n")[0] == 403


def test_paging_a_large_collection(world):
    """Pages through a collection of STUDIO_DOCS documents (20,000 by default; 1,000,000 measured for the note)."""
    a = world["a"]
    count = int(os.environ.get("STUDIO_DOCS", "20000"))
    a.call("db.create", db="big")
    started = time.monotonic()
    for first in range(0, count, 10_000):
        ops = [{"op": "insert", "collection": "items", "doc": {"_id": f"i{n:07d}", "n": n, "tag": f"t{n % 100}"}}
               for n in range(first, min(first + 10_000, count))]
        a.call("tx.commit", db="big", ops=ops)
    loaded = time.monotonic() - started
    browser = open_studio(world)
    started = time.monotonic()
    choose(browser, "big", "items")
    eventually(lambda: "50 documents, more follow" in browser.find_element(By.ID, "q-summary").text, "the first page")
    first_page = time.monotonic() - started
    first_ids = [r.get_attribute("data-id") for r in browser.find_elements(By.CSS_SELECTOR, "#docs tbody tr")]
    started = time.monotonic()
    browser.find_element(By.ID, "q-next").click()
    eventually(lambda: browser.find_element(By.CSS_SELECTOR, "#docs tbody tr").get_attribute("data-id") not in first_ids,
               "the second page")
    next_page = time.monotonic() - started
    second_ids = [r.get_attribute("data-id") for r in browser.find_elements(By.CSS_SELECTOR, "#docs tbody tr")]
    assert len(second_ids) == 50 and not set(first_ids) & set(second_ids)
    where = browser.find_element(By.ID, "q-where")
    where.send_keys('{"tag": "t7"}')
    started = time.monotonic()
    browser.find_element(By.CSS_SELECTOR, "#query button[type=submit]").click()
    eventually(lambda: all(r.text.endswith('"tag":"t7"}') for r in browser.find_elements(By.CSS_SELECTOR, "#docs tbody td.json"))
               and browser.find_elements(By.CSS_SELECTOR, "#docs tbody tr"), "the filtered page")
    filtered = time.monotonic() - started
    report = {"documents": count, "load_seconds": round(loaded, 1), "first_page_seconds": round(first_page, 2),
              "next_page_seconds": round(next_page, 2), "filtered_page_seconds": round(filtered, 2)}
    print("large collection:", json.dumps(report))
    with open(os.path.join(SHOTS, "large-collection.json"), "w") as f:
        json.dump(report, f)
    shot(browser, "large-collection")


def test_a_conflict_made_by_two_daemons_is_resolved_in_the_page(world):
    a, b = world["a"], world["b"]
    browser = open_studio(world)
    a.call("sync.pause", db="team")
    b.call("sync.pause", db="team")
    a.call("doc.patch", db="team", collection="notes", id="n1", set={"title": "title from A"})
    b.call("doc.patch", db="team", collection="notes", id="n1", set={"title": "title from B"})
    a.call("sync.resume", db="team")
    b.call("sync.resume", db="team")
    eventually(lambda: a.call("conflict.list", db="team")["conflicts"], "the conflict on A")
    eventually(lambda: b.call("conflict.list", db="team")["conflicts"], "the conflict on B")
    choose(browser, "team", "notes")
    click_tab(browser, "conflicts")
    row = eventually(lambda: browser.find_element(By.CSS_SELECTOR, '#c-list tr[data-id="n1"]'), "the conflict in the page")
    shot(browser, "conflicts")
    row.find_element(By.CSS_SELECTOR, "input").send_keys('"title agreed in Studio"')
    [w for w in row.find_elements(By.TAG_NAME, "button") if w.text == "write"][0].click()
    for d in (a, b):
        eventually(lambda d=d: not d.call("conflict.list", db="team")["conflicts"]
                   and d.call("doc.get", db="team", collection="notes", id="n1")["doc"]["title"] == "title agreed in Studio",
                   "the resolution on both daemons")
    eventually(lambda: not browser.find_elements(By.CSS_SELECTOR, '#c-list tr[data-id="n1"]'), "the conflict gone from the page")


def test_members_and_peers_show_and_a_member_is_revoked(world):
    a, b = world["a"], world["b"]
    browser = open_studio(world)
    choose(browser, "team", "notes")
    click_tab(browser, "sync")
    device_b = next(m["device"] for m in b.call("db.members", db="team")["members"] if m["thisDevice"])
    eventually(lambda: browser.find_element(By.CSS_SELECTOR, f'#s-members tr[data-device="{device_b}"]'), "B in the members")
    eventually(lambda: "inbound" in browser.find_element(By.ID, "s-peers").text, "B's link in the peers")
    eventually(lambda: browser.find_elements(By.CSS_SELECTOR, "#s-topology line.up"), "a connected link in the topology")
    shot(browser, "sync")
    # The table is rebuilt every 3 s while the tab shows.
    click(browser, f'#s-members tr[data-device="{device_b}"] button', "Revoke")
    eventually(lambda: any(m["device"] == device_b and m.get("removedAtMs") for m in a.call("db.members", db="team")["members"]),
               "B removed")
    eventually(lambda: "removed" in browser.find_element(By.CSS_SELECTOR, f'#s-members tr[data-device="{device_b}"]').text,
               "the removal in the page")


def test_the_live_view_keeps_up_with_a_thousand_events_a_second(world):
    """Measured, and reported: events written at about 1,000 a second reach the page, rendered in batches."""
    a = world["a"]
    browser = open_studio(world)
    a.call("db.create", db="stream")
    a.call("doc.put", db="stream", collection="e", id="seed", doc={})
    browser.refresh()
    eventually(lambda: stats(browser)["connected"], "the page to reconnect")
    choose(browser, "stream", "e")
    click_tab(browser, "live")
    browser.find_element(By.ID, "live-start").click()
    eventually(lambda: browser.find_element(By.ID, "live-stop").is_enabled(), "the subscription")
    total, per_tick = 5000, 100
    started = time.monotonic()
    with blazedb.Client(a.socket) as w:
        for tick in range(total // per_tick):
            ops = [{"op": "insert", "collection": "e", "doc": {"_id": f"e{tick}-{i}", "n": i}} for i in range(per_tick)]
            w.call("tx.commit", {"db": "stream", "ops": ops})
            # Paced at 1,000 events a second: a tenth of a second per hundred.
            pause = started + (tick + 1) * per_tick / 1000 - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    written = time.monotonic() - started
    eventually(lambda: stats(browser)["liveEvents"] >= total, f"{total} events in the page")
    seen = time.monotonic() - started
    probe = time.monotonic()
    browser.execute_script("return document.querySelectorAll('#live-events tr').length")
    s = stats(browser)
    report = {"events": s["liveEvents"], "write_seconds": round(written, 2), "events_per_second": round(total / written),
              "all_seen_seconds": round(seen, 2), "renders": s["batches"], "slowest_render_ms": round(s["maxBatchMs"], 1),
              "script_probe_ms": round((time.monotonic() - probe) * 1000, 1)}
    print("live view:", json.dumps(report))
    with open(os.path.join(SHOTS, "live-throughput.json"), "w") as f:
        json.dump(report, f)
    assert s["liveEvents"] == total
    assert len(browser.find_elements(By.CSS_SELECTOR, "#live-events tbody tr")) == 200, "the table keeps the last 200"
    shot(browser, "live-throughput")
