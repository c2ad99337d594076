"""The README's pictures (docs/screenshots/), taken on request only, never by a test run:

    SCREENSHOTS=1 ./run test tests/browser/test_screenshots.py

With SCREENSHOTS=1 the app under test reads the fixed demo folder docs/demo/ (tests/browser/conftest.py): its
saved design, its benchmark results file, and the Train page saves its comparison under docs/demo/designs/training/
(ignored by git), so the pictures show those paths and never a temporary folder.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCREENSHOTS
from test_app_browser import PAGES, assert_no_exception, open_page, settle, wait_until_idle

import engine

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -r requirements-test.txt)")
expect = sync_api.expect

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not SCREENSHOTS, reason="the README's pictures are taken on request: "
                                 "SCREENSHOTS=1 ./run test tests/browser/test_screenshots.py")]

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "screenshots"       # the README shows them


def photograph(page, name: str) -> None:
    page.wait_for_function("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    FOLDER.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(FOLDER / f"{name}.png"))
    assert (FOLDER / f"{name}.png").stat().st_size > 10_000


def test_screenshot_of_the_designer_with_the_lstm(page, app_url):
    """The LSTM opened from the Gallery into the Designer, the canvas fitted to the cell (the README's first
    picture)."""
    page.set_viewport_size({"width": 1920, "height": 1080})
    open_page(page, app_url, "Gallery")
    page.locator(".st-key-gallery-open-lstm").get_by_role("button").click()
    page.wait_for_url(lambda url: "gallery" not in url)
    page.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
    wait_until_idle(page)
    frame = page.frame_locator('[data-testid="stMain"] iframe[title*="cell_canvas"]')
    lstm = engine.preset("lstm").cell
    expect(frame.locator(".react-flow__node")).to_have_count(len(lstm.nodes) + len(lstm.state_names),
                                                             timeout=60_000)
    frame.get_by_role("button", name="fit view").click()
    assert_no_exception(page)
    page.locator('[data-testid="stMain"] h1').first.scroll_into_view_if_needed()   # the Gallery click scrolled
    photograph(page, "designer")


def test_screenshot_of_train(page, app_url):
    page.set_viewport_size({"width": 1920, "height": 1080})
    open_page(page, app_url, "Train")
    page.locator(".st-key-train-run").get_by_role("button").click()
    page.get_by_text("Trained 2 cell(s); saved to docs/demo/designs/training/").wait_for(timeout=180_000)
    wait_until_idle(page)
    for key in ("losses", "metrics"):
        page.locator(f".st-key-train-{key} .js-plotly-plot svg.main-svg").first.wait_for()
    assert_no_exception(page)
    page.locator(".st-key-train-losses").scroll_into_view_if_needed()
    photograph(page, "train")


@pytest.mark.parametrize("title", [p for p in PAGES if p not in ("Designer", "Train")])
def test_screenshot_of_each_other_page(page, app_url, title):
    page.set_viewport_size({"width": 1920, "height": 1080})
    open_page(page, app_url, title)
    settle(page)
    charts = page.locator('[data-testid="stMain"] .js-plotly-plot')
    for k in range(charts.count()):
        charts.nth(k).locator("svg.main-svg").first.wait_for()
    assert_no_exception(page)
    photograph(page, title.lower())
