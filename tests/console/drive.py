"""Drives ratelimitd's web console in a real headless Chromium for
tests/suite/console.rs, and prints what it saw as one JSON object: what the
live chart plots, what the simulator's charts plot after the form is
filled in and run, what the key section's peek and reset answered with the
admin token given, and the browser's console log.

Usage: drive.py <settings JSON>, with url, chromium, chromedriver,
patience (seconds), live_allowed and live_denied (the counts the live chart
must reach), form (field name -> value; true/false for a checkbox),
charts (how many simulator charts to wait for), admin (token and
request: peeked at, then reset, through the page's key section), and
leases (policy and key of a lease the test holds: once the Leases section
lists it, the driver prints one line saying so and reads a line back, the
test's word that the lease is gone, then waits for the section to say no
policy is leased).
"""

import json
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

LIVE = """
const chart = window.ratelimitdConsole && window.ratelimitdConsole.charts.live;
if (!chart) return null;
const sum = (values) => values.reduce((a, b) => a + (b || 0), 0);
return {allowed: sum(chart.data[1]), denied: sum(chart.data[2]), seconds: chart.data[0].length};
"""

LEASES = """
const rows = [...document.querySelectorAll('#leases-table tbody tr')];
return {
  empty_shown: !document.getElementById('leases-empty').hidden,
  table_shown: !document.getElementById('leases-table').hidden,
  rows: rows.map((tr) => [...tr.children].map((cell) => cell.textContent)),
};
"""


def main():
    settings = json.loads(sys.argv[1])
    options = webdriver.ChromeOptions()
    options.binary_location = settings["chromium"]
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=settings["chromedriver"]), options=options)
    try:
        wait = WebDriverWait(driver, settings["patience"])
        driver.get(settings["url"])

        def live_reached(driver):
            live = driver.execute_script(LIVE)
            if live and live["allowed"] >= settings["live_allowed"] and live["denied"] >= settings["live_denied"]:
                return live
            return None

        live = wait.until(live_reached, "the live chart to show the traffic sent")
        leases = None
        if "leases" in settings:
            leases = watch_the_leases(driver, wait, settings["leases"])

        for name, value in settings["form"].items():
            field = driver.find_element(By.NAME, name)
            if field.tag_name == "select":
                Select(field).select_by_value(value)
            elif field.get_attribute("type") == "checkbox":
                if field.is_selected() != value:
                    field.click()
            else:
                field.clear()
                field.send_keys(value)
        driver.find_element(By.ID, "sim-run").click()
        wait.until(
            lambda driver: driver.execute_script(
                "const c = window.ratelimitdConsole;"
                "return c.lastSimulation !== null && c.charts.simulation.length === arguments[0];",
                settings["charts"],
            ),
            "the simulator's charts",
        )
        simulated = driver.execute_script(
            "return window.ratelimitdConsole.charts.simulation.map((chart) => chart.data);"
        )
        sim_state = driver.find_element(By.ID, "sim-state").text
        admin = None
        if "admin" in settings:
            admin = use_the_key_section(driver, wait, settings["admin"])
        log = driver.get_log("browser")
    finally:
        driver.quit()
    print(json.dumps({"live": live, "leases": leases, "simulated": simulated, "sim_state": sim_state,
                      "admin": admin, "log": log}))


def watch_the_leases(driver, wait, leases):
    """Waits for the Leases section to list the policy `leases["policy"]`
    with a holder of `leases["key"]`; says so on stdout (one line) and
    waits for the test's line on stdin (the lease is gone); then waits for
    the section's empty state. Returns what the section showed each time."""

    def listed(driver):
        seen = driver.execute_script(LEASES)
        policy = any(row[0].startswith(leases["policy"] + ":") for row in seen["rows"])
        holder = any(len(row) > 1 and row[1] == leases["key"] for row in seen["rows"])
        return seen if seen["table_shown"] and not seen["empty_shown"] and policy and holder else None

    shown = wait.until(listed, "the Leases section to list the leased policy")
    print(json.dumps({"leases_shown": True}), flush=True)
    sys.stdin.readline()

    def empty(driver):
        seen = driver.execute_script(LEASES)
        return seen if seen["empty_shown"] and not seen["table_shown"] and not seen["rows"] else None

    gone = wait.until(empty, "the Leases section to say no policy is leased")
    return {"shown": shown, "gone": gone}


def use_the_key_section(driver, wait, admin):
    """Gives the page the admin token, then peeks at and resets the
    request `admin["request"]` with the page's buttons; returns what each
    answered (status and body)."""
    driver.find_element(By.ID, "token").send_keys(admin["token"])
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    wait.until(lambda driver: driver.find_element(By.ID, "token-state").text == "admin token set",
               "the page to take the token")
    box = driver.find_element(By.ID, "key-request")
    box.clear()
    box.send_keys(json.dumps(admin["request"]))
    answers = {}
    for action in ("peek", "reset"):
        driver.find_element(By.ID, f"key-{action}").click()
        answers[action] = wait.until(
            lambda driver: driver.execute_script(
                "const k = window.ratelimitdConsole.lastKey;"
                "return k && k.action === arguments[0] ? k : null;",
                action,
            ),
            f"the page's {action}",
        )
    return answers


if __name__ == "__main__":
    main()
