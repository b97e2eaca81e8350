"""The real app in a real browser: Debian's Chromium driven by Selenium against
`bench leaderboard` on a free port, on a store filled by real short runs."""

import os
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.integration]
SHOTS = Path(os.environ.get("BENCH_SCREENSHOTS", Path(__file__).parents[2] / "out" / "screenshots"))


from screenshot import chromium, serve  # noqa: E402  (tools/screenshot.py, on the path by conftest.py)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from test_leaderboard import fill

    tmp = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{tmp / 'store.db'}"
    os.environ["BENCH_HOME"] = str(tmp / "home")
    fill(url, tmp)
    proc, base = serve(url)
    yield base, url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def browser():
    d = chromium(1500, 1100)
    yield d
    d.quit()


def wait_text(driver, text, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if text in driver.find_element("tag name", "body").text:
            return
        time.sleep(0.3)
    raise AssertionError(f"{text!r} not on the page; it shows: {driver.find_element('tag name', 'body').text[:500]}")


def test_leaderboard_filter_and_run_page_in_chromium(served, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from sqlalchemy import select

    from bench.store import Run, open_store, session

    base, url = served
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.get(base)
    wait_text(browser, "4 cells")              # 2 algorithms × 2 dtypes, one seed each

    # filter by algorithm: the Algorithm multiselect is the third one
    boxes, deadline = [], time.time() + 60
    while len(boxes) < 5 and time.time() < deadline:
        boxes = browser.find_elements(By.CSS_SELECTOR, "div[data-testid='stMultiSelect'] input")
        time.sleep(0.3)
    time.sleep(1)
    browser.save_screenshot(str(SHOTS / "leaderboard.png"))
    # the viewer toolbar: the app menu is there, the Deploy button is not (Streamlit's default shows it on
    # localhost); the Leaderboard chart is drawn above the table
    assert browser.find_elements(By.CSS_SELECTOR, "[data-testid='stMainMenu']")
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid='stAppDeployButton']")
    assert browser.find_elements(By.CSS_SELECTOR, "[data-testid='stVegaLiteChart'] canvas, "
                                                  "[data-testid='stVegaLiteChart'] svg")
    boxes[2].click()
    boxes[2].send_keys("grpo")
    boxes[2].send_keys(Keys.ENTER)
    wait_text(browser, "2 cells")
    browser.save_screenshot(str(SHOTS / "leaderboard-filtered.png"))

    with session(open_store(url)) as s:
        run_id = s.scalars(select(Run.id).where(Run.algo == "grpo", Run.train_dtype == "bf16")).first()
    browser.get(f"{base}/run?run={run_id}")
    wait_text(browser, "training reward")
    wait_text(browser, "max_steps")
    browser.save_screenshot(str(SHOTS / "run.png"))
    assert (SHOTS / "run.png").stat().st_size > 10_000
