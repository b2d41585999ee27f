"""The browser half of tests/dashboard.rs: headless Chromium, driven by Selenium, against a
running `tollgate serve` (rules of tests/dashboard.rs, admin token given).

Without the token the page is refused; with it (sent as HTTP Basic credentials, as a browser
sends them after its prompt) the page shows the rules, and after the traffic this script drives
the denied client appears in the most-limited list and the counts move. Every wait polls the
page with a deadline; none is a fixed sleep. Prints `dashboard ok` at the end.

With `--masters N --open ADDR` (a server on a Redis Cluster store whose master ADDR is down):
the cluster masters panel lists the N masters, ADDR's breaker open and the others healthy,
then the screenshot is taken; prints `cluster panel ok`.
"""

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

DEADLINE = 30  # seconds: generous, the page updates every second


def need(cmd, package):
    path = shutil.which(cmd)
    if not path:
        sys.exit(f"`{cmd}` is missing: install the Debian package {package} (scripts/test.sh does)")
    return path


def check(base, key, value):
    body = json.dumps({"domain": "shop", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
    req = urllib.request.Request(base + "/v1/check", data=body.encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def browser(home):
    options = webdriver.ChromeOptions()
    options.binary_location = need("chromium", "chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1100", "--hide-scrollbars", f"--user-data-dir={home}"):
        options.add_argument(arg)
    service = Service(executable_path=need("chromedriver", "chromium-driver"))
    return webdriver.Chrome(service=service, options=options)


def card(driver, rule):
    return driver.find_element(By.CSS_SELECTOR, f'.rule[data-rule="shop|{rule}"]')


def figure(driver, rule, cls):
    return card(driver, rule).find_element(By.CSS_SELECTOR, f".fig.{cls} .n").text


def client_count(driver, rule, list_cls, key):
    items = card(driver, rule).find_elements(By.CSS_SELECTOR, f".{list_cls} li.client")
    for li in items:
        if li.get_attribute("data-key") == key:
            return li.get_attribute("data-count")
    return None


def wait(driver, what, cond):
    def ok(d):
        try:
            return cond(d)
        except Exception:  # the page replaces its elements every second
            return False
    WebDriverWait(driver, DEADLINE, poll_frequency=0.1).until(ok, message=f"waiting for {what}")


def login(driver, base, token):
    cred = base64.b64encode(f"admin:{token}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                           {"headers": {"Authorization": "Basic " + cred}})
    driver.get(base + "/dashboard")


def masters(driver):
    rows = driver.find_elements(By.CSS_SELECTOR, "#nodes tr.node")
    return {r.get_attribute("data-node"): r.get_attribute("data-state") for r in rows}


def cluster_panel(driver, args):
    login(driver, args.base, args.token)
    want = lambda m: (len(m) == args.masters and m.get(args.open) == "open"
                      and all(s == "healthy" for a, s in m.items() if a != args.open))
    wait(driver, "the masters, one open", lambda d: d.find_element(By.ID, "nodes-card").is_displayed()
         and want(masters(d)))
    row = driver.find_element(By.CSS_SELECTOR, f'#nodes tr.node[data-node="{args.open}"]')
    assert "open" in row.text, row.text
    logs = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not logs, logs
    driver.find_element(By.ID, "nodes-card").screenshot(args.screenshot)
    print("cluster panel ok", masters(driver))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--screenshot", required=True)
    ap.add_argument("--masters", type=int)
    ap.add_argument("--open")
    args = ap.parse_args()
    home = os.environ.get("TOLLGATE_BROWSER_HOME") or tempfile.mkdtemp(prefix="tollgate-chromium-")
    driver = browser(home)
    if args.masters:
        try:
            cluster_panel(driver, args)
        finally:
            driver.quit()
        return
    try:
        # Without credentials: refused, nothing of the page.
        driver.get(args.base + "/dashboard")
        assert not driver.find_elements(By.ID, "rules"), driver.page_source[:500]
        assert "/v1/stats" not in driver.page_source
        driver.get_log("browser")  # the 401 of that load is logged; later errors are not expected

        # With the token as the HTTP Basic password on every request of the page.
        login(driver, args.base, args.token)
        wait(driver, "the rules", lambda d: figure(d, "user", "denied") == "0")
        assert "shadow mode" in card(driver, "api_key").text
        assert not driver.find_element(By.ID, "nodes-card").is_displayed(), "no cluster: no panel"

        codes = [check(args.base, "user", "mallory") for _ in range(7)]
        assert codes == [200, 200, 200, 429, 429, 429, 429], codes
        for _ in range(5):
            assert check(args.base, "api_key", "k-noisy") == 200

        wait(driver, "mallory in the most-limited list",
             lambda d: client_count(d, "user", "most-limited", "user=mallory") == "4")
        wait(driver, "the counts", lambda d: figure(d, "user", "denied") == "4"
             and figure(d, "user", "allowed") == "3")
        wait(driver, "the would-be-denied key",
             lambda d: client_count(d, "api_key", "would-be-denied", "api_key=k-noisy") == "3")

        for _ in range(3):
            assert check(args.base, "user", "mallory") == 429
        wait(driver, "the count to move",
             lambda d: client_count(d, "user", "most-limited", "user=mallory") == "7"
             and figure(d, "user", "denied") == "7")
        assert driver.find_element(By.ID, "notice").is_displayed() is False
        logs = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not logs, logs
        driver.save_screenshot(args.screenshot)

        # Opened with the credentials in the URL, as curl users write it (no header added):
        # the page still reads /v1/stats (it fetches from its origin, which has none), and its
        # script runs under a policy without 'unsafe-inline'. The generation in the header is
        # one the reload list shows.
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
        host = args.base.split("://", 1)[1]
        driver.get(f"http://admin:{args.token}@{host}/dashboard")
        wait(driver, "the rules, read with the URL's credentials",
             lambda d: figure(d, "user", "denied") == "7")
        assert driver.find_element(By.ID, "notice").is_displayed() is False, \
            driver.find_element(By.ID, "notice").text
        meta = driver.find_element(By.ID, "meta").text
        generation = meta.split("generation ")[1].split()[0]
        reloads = driver.find_element(By.ID, "reloads").text
        assert f"generation {generation}" in reloads, (meta, reloads)
        logs = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not logs, logs
        print("dashboard ok")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
