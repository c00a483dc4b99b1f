"""The labelling page in a real browser: Debian's headless Chromium driven by selenium
through Debian's chromedriver (no browser download), against the real `slimserve-label`
command in a child process under the suite's memory cap. Labelling with a click and with
a key, arrows, none of these, skip, resume after the server is killed (-9) and started
again, two labellers at once (two browser sessions, two page processes), and a log whose
bytes are hostile: nothing in it executes and the page keeps working."""
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from slimserve.flywheel.labelling import store as label_store
from slimserve.serving import server_process
from slimserve.testing.servers import MEMORY_CAP
from tests.helpers import ROOT, require_tool
from tests.label_logs import (HOSTILE_MODEL, digits_model, served_logs,  # noqa: F401
                              write_hostile_logs)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

READY = re.compile(r"image\(s\) to label at (http://127\.0\.0\.1:\d+/)")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


class LabelServer:
    """`slimserve-label ARGS` in a child process on a free port (its stderr in a file)."""

    def __init__(self, *args, timeout=300):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        # The servers' launcher (capped, killed with this process), not a preexec_fn,
        # which runs in a fork of this multi-threaded process (gRPC's fork handlers too):
        # a child started so once died silently with only a gRPC poller error.
        self.process = subprocess.Popen(
            server_process.launcher_argv(
                [sys.executable, "-m", "slimserve.cli.label", "--port=0", "--noprogress"]
                + [str(a) for a in args], MEMORY_CAP),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.stderr, stdin=subprocess.DEVNULL,
            text=True)
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 5)
            if ready:
                line = self.process.stdout.readline()
                if not line:
                    break
                lines.append(line)
                match = READY.search(line)
                if match:
                    self.url = match.group(1)
                    return
        self.process.kill()
        self.process.wait(60)
        self.stderr.seek(0)
        raise AssertionError("slimserve-label did not start (exit status %s): %s\n%s" % (
            self.process.returncode, "".join(lines), self.stderr.read()[-4000:]))

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(60)

    def stop(self):
        """SIGTERM -> (exit status, the rest of stdout, stderr)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=60)
        self.stderr.seek(0)
        return self.process.returncode, out, self.stderr.read()


@pytest.fixture
def browsers(tmp_path):
    """browsers() -> a fresh headless Chromium session (its own profile); all quit after."""
    chromium = require_tool("chromium", "chromium-browser")
    driver_path = require_tool("chromedriver")
    started = []

    def start():
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument("--user-data-dir=%s" % (tmp_path / ("profile-%d" % len(started))))
        options.add_argument("--window-size=1200,900")
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        driver.set_page_load_timeout(60)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.quit()


@pytest.fixture
def servers():
    started = []

    def start(*args):
        server = LabelServer(*args)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.kill()


def provenance(output_dir):
    path = os.path.join(output_dir, label_store.PROVENANCE_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        return {r["request_id"]: r for r in map(json.loads, handle)}


def focused(driver):
    return driver.find_element(By.CSS_SELECTOR, ".card.focused")


def visible_cards(driver):
    return [c.get_attribute("data-request-id")
            for c in driver.find_elements(By.CSS_SELECTOR, ".card") if c.is_displayed()]


def all_cards(driver):
    return [c.get_attribute("data-request-id")
            for c in driver.find_elements(By.CSS_SELECTOR, ".card")]


def replaced(element):
    """A wait condition: `element` left the document (the answer page replaced it).
    expected_conditions.staleness_of, except that Chromium sometimes reports a node of
    the replaced document as an inspector error instead of a stale element
    (SeleniumHQ/selenium#15401): that means replaced as well."""
    def check(_):
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            if "does not belong to the document" not in str(error):
                raise
            return True
        return False
    return check


def press(driver, key):
    """Presses a key on the page and waits for the answer page to replace it."""
    card = focused(driver)
    ActionChains(driver).send_keys(key).perform()
    WebDriverWait(driver, 60).until(replaced(card))


def no_script_ran(driver):
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # pylint: disable=expression-not-assigned
    return driver.execute_script("return window.canary === undefined")


@pytest.mark.cost(8)
def test_click_key_arrows_skip_none_and_resume_after_kill(served_logs, digits_model, tmp_path,
                                                          browsers, servers):
    base, _ = digits_model
    out = str(tmp_path / "labels")
    args = ("--logs", served_logs, "--model_base_path", base, "--output_dir", out,
            "--grid_size", 3, "--labeller", "ada")
    server = servers(*args)
    driver = browsers()
    driver.get(server.url)
    assert len(visible_cards(driver)) == 1 and len(all_cards(driver)) == 3  # one at a time
    assert no_script_ran(driver)
    # A click on class 4.
    first = focused(driver)
    clicked = first.get_attribute("data-request-id")
    first.find_element(By.CSS_SELECTOR, 'button[value="label:4"]').click()
    WebDriverWait(driver, 60).until(replaced(first))
    record = provenance(out)[clicked]
    assert record["decision"] == "label" and record["class"] == "4"
    assert record["labeller"] == "ada" and os.path.exists(os.path.join(out, record["file"]))
    assert "1 labelled" in driver.find_element(By.ID, "counts").text
    # Key 7 is class 6.
    keyed = focused(driver).get_attribute("data-request-id")
    assert keyed != clicked
    press(driver, "7")
    assert provenance(out)[keyed]["class"] == "6"
    # Arrows move to the next image (one at a time: only it is shown); s skips it.
    before = focused(driver).get_attribute("data-request-id")
    ActionChains(driver).send_keys(Keys.ARROW_RIGHT).perform()
    after = focused(driver).get_attribute("data-request-id")
    assert after != before and visible_cards(driver) == [after]
    press(driver, "s")
    assert provenance(out)[after]["decision"] == "skip" and before not in provenance(out)
    press(driver, "n")
    nothing = [rid for rid, r in provenance(out).items() if r["decision"] == "none"]
    assert len(nothing) == 1
    decided = set(provenance(out))
    assert len(decided) == 4
    held = set(all_cards(driver))  # claimed by this page's session
    assert before in held

    # kill -9 and start again on the same folder: nothing decided comes back, the dead
    # page's claims are void, and labelling goes on.
    server.kill()
    server = servers(*args)
    driver.get(server.url)
    counts = driver.find_element(By.ID, "counts").text
    assert "2 labelled" in counts and "1 none of these" in counts and "1 skipped" in counts
    shown = all_cards(driver)
    assert not decided & set(shown) and before in shown
    press(driver, "1")
    records = provenance(out)
    assert len(records) == 5 and records[shown[0]]["class"] == "0"
    assert "Resumed: 4 decision(s)" in driver.find_element(By.TAG_NAME, "footer").text
    code, out_text, err = server.stop()
    assert code == 0 and "3 labelled, 1 none of these, 1 skipped" in out_text
    assert "Traceback" not in err


@pytest.mark.cost(16)
def test_two_labellers_at_once(served_logs, digits_model, tmp_path, browsers, servers):
    base, _ = digits_model
    out = str(tmp_path / "labels")
    common = ("--logs", served_logs, "--model_base_path", base, "--output_dir", out,
              "--grid_size", 3, "--view", "grid")
    server = servers(*common)
    alice, bob = browsers(), browsers()
    for driver, name in ((alice, "alice"), (bob, "bob")):
        driver.get(server.url)
        field = driver.find_element(By.CSS_SELECTOR, "#labeller input[name=name]")
        field.clear()
        field.send_keys(name)
        button = driver.find_element(By.CSS_SELECTOR, "#labeller button")
        button.click()
        WebDriverWait(driver, 60).until(replaced(button))
        assert driver.find_element(By.CSS_SELECTOR, "#labeller input[name=name]"
                                   ).get_attribute("value") == name
    assert len(visible_cards(alice)) == 3  # the grid
    assert not set(all_cards(alice)) & set(all_cards(bob))  # each holds its own images
    # A second page process on the same folder offers a third person other images still.
    other = servers(*common)
    carol = browsers()
    carol.get(other.url)
    assert not set(all_cards(carol)) & (set(all_cards(alice)) | set(all_cards(bob)))
    # Both label in turn, with keys.
    for _ in range(3):
        press(alice, "1")
        press(bob, "2")
    press(carol, "3")
    records = provenance(out)
    assert len(records) == 7
    by = {name: [r for r in records.values() if r["labeller"] == name]
          for name in ("alice", "bob")}
    assert len(by["alice"]) == 3 and {r["class"] for r in by["alice"]} == {"0"}
    assert len(by["bob"]) == 3 and {r["class"] for r in by["bob"]} == {"1"}
    files = [f for d in os.listdir(out) if os.path.isdir(os.path.join(out, d))
             for f in os.listdir(os.path.join(out, d))]
    assert len(files) == 7 == len(set(files))
    server.stop()
    other.stop()

    # With claims that expire at once, both are shown the same image; the second to
    # decide is told who was first (by the name alice's browser kept across the restart),
    # and the page keeps working.
    server = servers(*common, "--claim_seconds", 1)
    alice.get(server.url)
    time.sleep(1.5)  # alice's claim expires (not a speed assertion)
    bob.get(server.url)
    same = all_cards(alice)[0]
    assert all_cards(bob)[0] == same
    press(alice, "5")
    press(bob, "6")
    message = bob.find_element(By.ID, "message").text
    assert "already decided" in message and "labelled 4 by alice" in message
    assert provenance(out)[same]["class"] == "4" and len(provenance(out)) == 8
    assert bob.find_elements(By.CSS_SELECTOR, ".card")  # still a working page
    press(bob, "6")
    assert len(provenance(out)) == 9


@pytest.mark.cost(5)
def test_hostile_logged_bytes_never_run_in_the_page(digits_model, tmp_path, browsers,
                                                    servers):
    base, held_out = digits_model
    good = next(open(p, "rb").read() for p, _ in held_out if p.endswith(".jpg"))
    pattern = write_hostile_logs(str(tmp_path / "hostile"), good)
    out = str(tmp_path / "labels")
    server = servers("--logs", pattern, "--model_base_path", base, "--output_dir", out)
    driver = browsers()
    driver.get(server.url)
    assert no_script_ran(driver)
    card = focused(driver)
    assert card.find_element(By.CSS_SELECTOR, ".model").text == HOSTILE_MODEL  # as text
    shot = card.find_element(By.CSS_SELECTOR, "img.shot")
    assert driver.execute_script("return arguments[0].naturalWidth", shot) > 0  # a PNG
    footer = driver.find_element(By.TAG_NAME, "footer").text
    assert "image not shown" in footer and "not a JPEG, PNG, GIF or BMP" in footer
    assert "malformed record" in footer and "damaged log file" in footer
    # Even markup that did reach the DOM could not run: the policy allows no inline script.
    driver.execute_script("document.body.insertAdjacentHTML('beforeend', "
                          "'<img src=x onerror=\"window.canary=5\">')")
    time.sleep(0.5)
    assert no_script_ran(driver)
    driver.get(server.url + "image/%3Cscript%3E.png")
    assert "not found" in driver.find_element(By.TAG_NAME, "body").text
    driver.get(server.url)
    press(driver, "3")
    assert [r["class"] for r in provenance(out).values()] == ["2"]
    assert "Nothing left to label" in driver.find_element(By.ID, "done").text
    assert no_script_ran(driver)
