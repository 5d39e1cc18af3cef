"""The fleet page (/ui/, issue #25) in a real browser: Debian's headless Chromium driven by selenium
through Debian's chromedriver, against a real twine-controld over TLS with heartbeats carrying usage.
It logs in with a token, opens the region, an MSB, an entitlement and a job, and holds the numbers
shown to the API's; a wrong token shows an error, not a blank page. Screenshots of each view are
written under the test's temporary directory (printed with -s), not committed. (Served over plain
HTTP on loopback: the browser would need our throwaway CA otherwise; TLS is the Prometheus test's.)"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
import urllib.request

import pytest

from controlplane.store import Store
from controlplane.usage import history as H
from controlplane.usage.recorder import UsageKeys
from tests.controlplane.controld_proc import API_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import TASK, register

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
MISSING = [n for n, p in (("chromium", CHROMIUM), ("chromium-driver", DRIVER)) if p is None]
try:
    import selenium  # noqa: F401
except ImportError:
    MISSING.append("selenium")

pytestmark = pytest.mark.skipif(bool(MISSING) and os.environ.get("CI") != "true",
                                reason=f"not installed: {', '.join(MISSING)} (scripts/setup.sh installs them)")


async def last_hour(port: int, region: str) -> None:
    """An hour of points for web/api and its entitlement, as a leader writes them at the hour's end."""
    store = Store([("127.0.0.1", port)])
    hour = int(time.time() // 3600) - 1
    series = H.Series()
    for i in range(60):
        series.put_minute(hour * 60 + i, 1000 + 10 * i, 60 + i % 7)
    keys = UsageKeys(region)
    await store.commit([], {keys.minutes(k, hour): H.hour_record(series, hour)
                            for k in (("job", "web/api"), ("entitlement", "web"))})
    await store.close()


def chrome(tmp_path, *extra: str, hosts: tuple[str, ...] = ("127.0.0.1",)):
    """Debian's headless Chromium through Debian's chromedriver (selenium finds and fetches nothing);
    it reaches no host but `hosts`."""
    assert not MISSING, f"not installed: {', '.join(MISSING)} (scripts/setup.sh installs them)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # driver.get_log("browser"): every console line
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
              f"--user-data-dir={tmp_path / 'chromium'}", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--disable-default-apps",
              "--host-resolver-rules=MAP * ~NOTFOUND, " + ", ".join(f"EXCLUDE {h}" for h in hosts), *extra):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER, log_output=str(tmp_path / "chromedriver.log")),
                              options=opts)
    driver.set_page_load_timeout(30)
    return driver


def spki_pin(cert_pem: bytes) -> str:
    """The certificate's public key as Chromium's --ignore-certificate-errors-spki-list takes it:
    that one key is trusted (the region's throwaway CA is not the browser's)."""
    import base64
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert_pem).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def sign_in(driver, url: str, token: str, view: str) -> None:
    """Open the page at `view` (#/...), give it the token, and wait until the view is drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{url}/ui/#/{view}")
    wait = WebDriverWait(driver, 30)
    wait.until(EC.visibility_of_element_located((By.ID, "token"))).send_keys(token)
    driver.find_element(By.ID, "login-button").click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, f'#view[data-ready="{view.split("/")[0]}"]')))


@pytest.fixture
def browser(tmp_path):
    driver = chrome(tmp_path)
    yield driver
    driver.quit()


def test_the_fleet_page_shows_what_the_api_says_and_a_wrong_token_an_error(tmp_path, etcd_server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    c = Controld(tmp_path, etcd_server.port, extra=("--usage-sample", "0.2")).start()
    stop = threading.Event()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        creds = {m: register(c, m, dc, msb, cpus=4, memory_mb=4096)
                 for m, dc, msb in (("m1", "dc1", "msb1"), ("m2", "dc1", "msb2"), ("m3", "dc2", "msb3"))}
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
        asyncio.run(last_hour(etcd_server.port, c.region))  # the history a leader kept before: the chart's
        status, job = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 2,
                                                 "task": {**TASK, "cpus": 1.5}})
        assert status == 201, job
        on = {t["machine"]: t["index"] for t in job["tasks"]}

        def heartbeats():
            while not stop.is_set():
                for mid, cred in creds.items():
                    tasks = [["web/api", on[mid], 0.75, 40.0]] if mid in on else []
                    usage = {"window": 1.0, "cpus": 4, "cpu": 0.2 + sum(t[2] for t in tasks), "memory_mb": 700.0,
                             "memory_total_mb": 4096.0, "tasks": tasks}
                    c.call("POST", "/v1/agent/heartbeat", {"digest": "a", "tasks": [], "usage": usage}, token=cred)
                stop.wait(0.5)

        threading.Thread(target=heartbeats, daemon=True).start()
        c.wait_for("/v1/jobs/web/api/usage", lambda u: (u["current"] or {}).get("tasks_reporting") == 2,
                   what="both tasks reporting")
        wait = WebDriverWait(browser, 20)

        def shown(k: str) -> str:
            return wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, f'[data-k="{k}"]'))).text

        def ready(view: str) -> None:
            wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, f'#view[data-ready="{view}"]')))

        # a wrong token: the error says so, and the sign-in form is back
        with urllib.request.urlopen(c.url + "/ui/", timeout=10) as r:  # no token: the page holds no data
            assert r.status == 200 and "default-src 'none'" in r.headers["Content-Security-Policy"]
        browser.get(c.url + "/ui/")
        wait.until(EC.visibility_of_element_located((By.ID, "token"))).send_keys("not-the-token")
        browser.find_element(By.ID, "login-button").click()
        error = wait.until(EC.visibility_of_element_located((By.ID, "error")))
        assert "token was refused (401)" in error.text, error.text
        assert browser.find_element(By.ID, "token").is_displayed()
        browser.save_screenshot(str(shots / "0-wrong-token.png"))

        # the region: its totals are the API's
        browser.find_element(By.ID, "token").send_keys(API_TOKEN)
        browser.find_element(By.ID, "login-button").click()
        ready("region")
        fleet = c.call("GET", "/v1/fleet?by=dc,msb,entitlement")[1]
        cells = fleet["cells"]
        assert int(shown("machines")) == sum(x["machines"] for x in cells) == 3
        assert float(shown("reserved")) == sum(x["reserved"]["cpus"] for x in cells) == 3
        assert float(shown("used")) == pytest.approx(sum(x["used"]["cpus"] for x in cells)) and float(shown("used")) == 1.5
        assert shown("held-web") == f"{fleet['entitlements']['web']['held']} / 2"
        assert browser.execute_script("return sessionStorage.getItem('twine-token')") == API_TOKEN
        assert API_TOKEN not in browser.current_url and not browser.get_cookies()
        browser.save_screenshot(str(shots / "1-region.png"))

        # one MSB: its machines, and no more
        browser.get(c.url + "/ui/#/msb/dc1/msb1")
        ready("msb")
        assert int(shown("msb-machines")) == len(c.call("GET", "/v1/machines?dc=dc1&msb=msb1")[1]["machines"]) == 1
        browser.save_screenshot(str(shots / "2-msb.png"))

        # the entitlement and the job: used against reserved, as the API has them
        browser.get(c.url + "/ui/#/entitlement/web")
        ready("entitlement")
        eu = c.call("GET", "/v1/entitlements/web/usage")[1]
        assert float(shown("used-cpus")) == eu["current"]["cpus"] == 1.5
        assert float(shown("reserved-cpus")) == eu["reserved"]["cpus"] == 3
        assert shown("quota") == "2"
        browser.save_screenshot(str(shots / "3-entitlement.png"))
        browser.get(c.url + "/ui/#/job/web/api")
        ready("job")
        ju = c.call("GET", "/v1/jobs/web/api/usage?since=21600")[1]  # as the page asks
        assert float(shown("used-cpus")) == ju["current"]["cpus"] and int(shown("count")) == 2
        assert int(shown("used-memory")) == ju["current"]["memory_mb"] == 80
        assert len(ju["points"]) >= 6 and browser.find_elements(By.CSS_SELECTOR, ".chart canvas")  # uPlot drew it
        assert not browser.find_elements(By.CSS_SELECTOR, '[data-k="no-points"]')
        browser.save_screenshot(str(shots / "4-job.png"))
        browser.get(c.url + "/ui/#/events")
        ready("events")
        browser.save_screenshot(str(shots / "5-events.png"))
        # nothing the page loaded came from anywhere but the daemon, and the CSP refused nothing
        logs = browser.get_log("browser")
        assert not [entry for entry in logs if "Content Security Policy" in entry["message"]], logs
        print(f"\nscreenshots: {shots}")
    finally:
        stop.set()
        c.close()


WINDOW = 6 * 3600  # what the page asks the usage API for (since=21600)


async def one_point(port: int, region: str, minute: int) -> None:
    """One minute of history for web/api and its entitlement, as a leader writes it at the hour's end."""
    store = Store([("127.0.0.1", port)])
    series = H.Series()
    series.put_minute(minute, 1500, 80)
    keys = UsageKeys(region)
    await store.commit([], {keys.minutes(k, minute // 60): H.hour_record(series, minute // 60)
                            for k in (("job", "web/api"), ("entitlement", "web"))})
    await store.close()


def drawn(driver, view: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    name = view.split("/")[0]
    WebDriverWait(driver, 20).until(EC.presence_of_element_located((By.CSS_SELECTOR, f'#view[data-ready="{name}"]')))


def test_a_usage_chart_spans_the_window_asked_for_whatever_its_points(tmp_path, etcd_server, browser):
    """Issue #35: with one point uPlot would scale the x axis to the point (Feb 2027 to Aug 2029);
    every usage chart of the job and entitlement views spans the six hours the page asked for, ending now."""
    c = Controld(tmp_path, etcd_server.port).start()
    try:
        register(c, "m1", "dc1", "msb1", cpus=4, memory_mb=4096)
        minute = int(time.time() // 60) - 90  # in an hour already closed (the current one is not written yet)
        asyncio.run(one_point(etcd_server.port, c.region, minute))  # before the series exist: the leader loads it
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        status, job = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": TASK,
                                                 "autoscale": {"min": 1, "max": 2, "target_cpu": 0.5}})
        assert status == 201, job
        for path in ("/v1/jobs/web/api/usage", "/v1/entitlements/web/usage"):
            c.wait_for(f"{path}?since={WINDOW}", lambda u: len(u["points"]) == 1, what=f"{path}: one point")
        sign_in(browser, c.url, API_TOKEN, "job/web/api")
        for view, charts in (("job/web/api", 2), ("entitlement/web", 1)):  # the job's: usage, autoscaling
            browser.get(f"{c.url}/ui/#/{view}")
            drawn(browser, view)
            scales = browser.execute_script("return [...document.querySelectorAll('#view .chart')]"
                                            ".map((b) => [b.chart.scales.x.min, b.chart.scales.x.max])")
            now = time.time()
            assert len(scales) == charts, (view, scales)
            for lo, hi in scales:
                assert hi - lo == pytest.approx(WINDOW, abs=60), (view, lo, hi)
                assert now - 60 <= hi <= now + 60, (view, hi, now)
                assert lo <= minute * 60 <= hi
            if view.startswith("job"):
                browser.save_screenshot("/tmp/fleet-axis.png")
    finally:
        c.close()


def test_the_page_asks_for_no_icon_the_api_refuses(tmp_path, etcd_server, browser):
    """Issue #35: Chromium asked for /favicon.ico on every view and logged the API's 401; the page
    declares its own icon, served with its other files (no token), and the console stays clean."""
    c = Controld(tmp_path, etcd_server.port).start()
    try:
        with urllib.request.urlopen(c.url + "/ui/favicon.svg", timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"] == "image/svg+xml" and b"<svg" in r.read()
        sign_in(browser, c.url, API_TOKEN, "jobs")
        browser.get(f"{c.url}/ui/#/entitlements")
        drawn(browser, "entitlements")
        time.sleep(1)  # the browser asks for the icon after the page has loaded
        logs = browser.get_log("browser")
        assert not [e for e in logs if e["level"] == "SEVERE"], logs
    finally:
        c.close()


async def capacity_hours(port: int, region: str, group: str, hours: range) -> None:
    """The pool's hours as the leader of shard 0 keeps them, each with the lines it offered after it."""
    store = Store([("127.0.0.1", port)])
    prefix = f"/twine-usage/{region}/capacity/"
    puts = {f"{prefix}{t:08d}": {"groups": {group: {"machines": 3, "guaranteed": 1, "opportunistic": 1, "free": 1,
                                                      "reclaiming": 0, "available": 2 - t % 2, "buffer": 1}},
                                 "offered": {group: [1] * 24}} for t in hours}
    await store.commit([], puts)
    await store.close()


def test_the_capacity_view_shows_the_pool_the_buffer_and_the_offer_as_the_api_has_them(tmp_path, etcd_server,
                                                                                        browser):
    """Issue #37: per machine type and dc, what guaranteed and opportunistic entitlements hold, what is
    free, the failure-domain buffer and the line offered now, as /v1/capacity/forecast has them; a chart of
    the hours kept and the next 24 on one axis from the week asked for to the forecast's last hour."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    # the hour now is the API's and the page's, one hour and not two, and the daemon's own recorder (its
    # first look a minute after it starts) writes no hour of its own: the test (20 s alone) ends in it
    if (left := 3600 - time.time() % 3600) < 150:
        time.sleep(left + 1)
    c = Controld(tmp_path, etcd_server.port).start()
    stop = threading.Event()
    try:
        creds = [register(c, m, "dc1", msb, cpus=4, memory_mb=4096)
                 for m, msb in (("m1", "msb1"), ("m2", "msb2"), ("m3", "msb2"))]

        def heartbeats():
            while not stop.is_set():
                for cred in creds:
                    c.call("POST", "/v1/agent/heartbeat", {"digest": "a", "tasks": []}, token=cred)
                stop.wait(0.5)

        threading.Thread(target=heartbeats, daemon=True).start()
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        assert c.call("POST", "/v1/entitlements", {"name": "batch", "machine_type": "generic", "quota": 1,
                                                   "kind": "opportunistic"})[0] == 201
        for ent in ("web", "batch"):
            assert c.call("POST", "/v1/jobs", {"entitlement": ent, "name": "a", "count": 1, "task": TASK})[0] == 201
        group = "generic/dc1"
        hour = int(time.time() // 3600)
        asyncio.run(capacity_hours(etcd_server.port, c.region, group, range(hour - 30, hour)))
        fc = c.wait_for("/v1/capacity/forecast", lambda b: any(
            g["now"].get("guaranteed") == 1 and g["now"].get("opportunistic") == 1 for g in b["groups"]),
            what="web and batch each holding a machine")
        [now] = [g for g in fc["groups"] if g["group"] == group]
        assert now["now"]["buffer"] == 1 and now["now"]["available"] == 2, now["now"]  # batch's and the free one
        past = c.call("GET", "/v1/capacity/history?since=86400")[1]
        [kept] = [g for g in past["groups"] if g["group"] == group]
        assert len(kept["hours"]) == 24 and kept["hours"][-1]["offered"] == 1, kept["hours"][-1]
        assert c.call("GET", "/v1/capacity/history?since=60")[0] == 400  # less than an hour: named

        sign_in(browser, c.url, API_TOKEN, "capacity")
        wait = WebDriverWait(browser, 20)
        for k in ("machines", "guaranteed", "opportunistic", "free", "available", "buffer"):
            cell = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, f'[data-k="cap-{group}-{k}"]')))
            assert int(cell.text) == now["now"][k], (k, cell.text, now["now"])
        assert browser.find_element(By.CSS_SELECTOR, f'[data-k="cap-{group}-offered"]').text == \
            str(now["hours"][0]["offered"])
        x = browser.execute_script(
            "const b = document.querySelector('#view .chart');"
            "return [b.chart.scales.x.min, b.chart.scales.x.max, b.chart.data[0].length];")
        history = c.call("GET", "/v1/capacity/history?since=604800")[1]
        [week] = [g for g in history["groups"] if g["group"] == group]
        assert x[0] == history["since"] and x[1] == now["hours"][-1]["hour"] + 3600, (x, history["since"])
        assert x[2] == len(week["hours"]) + 24 == 30 + 24  # every hour kept, then the forecast's
        browser.save_screenshot(str(tmp_path / "capacity.png"))
        logs = browser.get_log("browser")
        assert not [e for e in logs if e["level"] == "SEVERE"], logs
    finally:
        stop.set()
        c.close()
