"""The app driven the way a person would: headless Chromium against `streamlit run app/main.py`.

Every wait polls for what should appear (a heatmap, a button, a finished run); nothing sleeps.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -r requirements-test.txt)")
expect = sync_api.expect

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("Designer", "Gallery", "Schedule", "Networks", "Benchmarks", "Divergence", "Train", "Export")


def wait_until_idle(page) -> None:
    """Wait until the script run has finished: no 'Running...' status and no stale (greyed) elements."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " && !document.querySelector('[data-stale=\"true\"]')")


def assert_no_exception(page) -> None:
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.first.inner_text()


def open_page(page, app_url: str, title: str) -> None:
    """Open the app at its entry point, then the page through the sidebar, as a person would."""
    page.goto(app_url)
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
    page.locator('[data-testid="stMain"] h1').filter(has_text=title).first.wait_for()
    wait_until_idle(page)


def test_schedule_shows_the_wavefront_heatmap(page, app_url):
    open_page(page, app_url, "Schedule")
    chart = page.locator(".st-key-schedule-heatmap .js-plotly-plot")
    chart.wait_for()
    chart.locator("svg.main-svg").first.wait_for()
    # plotly draws a heatmap trace as an image in its 'hm' layer, and one text label per layer-step
    expect(chart.locator("g.hm image")).to_have_count(1)
    labels = chart.locator("g.heatmap-label text")
    expect(labels.first).to_be_attached()
    wait_until_idle(page)
    num_layers = int(page.locator(".st-key-schedule-num_layers input").input_value())
    steps = int(page.locator(".st-key-schedule-steps input").input_value())
    expect(labels).to_have_count(num_layers * min(steps, 48))   # 48: HEATMAP_STEPS of the page
    assert_no_exception(page)
    assert "wavefront" in page.locator('[data-testid="stMain"]').inner_text()


def test_export_downloads_the_cuda_file(page, app_url):
    if importlib.util.find_spec("engine.export") is None:
        pytest.skip("engine.export is not part of this engine yet: there is no .cu to download")
    open_page(page, app_url, "Export")
    button = page.locator(".st-key-export-cu").get_by_role("button")
    button.wait_for()
    with page.expect_download() as info:
        button.click()
    download = info.value
    assert download.suggested_filename == "lstm_rnn.cu"
    source = Path(download.path()).read_text()
    assert "__global__" in source, source[:500]
    assert "-o lstm_rnn lstm_rnn.cu" in source            # the file is named as its own build line compiles it
    assert_no_exception(page)


def test_every_page_renders_under_its_own_tab_title(page, app_url):
    """Each page opened from the sidebar shows no exception, and the browser tab names the page and the app."""
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.goto(app_url)
    nav = page.locator('[data-testid="stSidebarNav"]')
    for title in PAGES:
        expect(nav.get_by_text(title, exact=True)).to_have_count(1)
    for title in PAGES:                 # from page to page through the sidebar, in one session
        wait_until_idle(page)
        nav.get_by_text(title, exact=True).click()
        page.locator('[data-testid="stMain"] h1').filter(has_text=title).first.wait_for()
        expect(page).to_have_title(f"{title} · cellforge", timeout=30_000)
        settle(page)
        assert_no_exception(page)
        if title == "Schedule":
            expect(page.locator('[data-testid="stMain"]')).to_contain_text("cell lstm")


def settle(page) -> None:
    settled = ("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
               " && !document.querySelector('[data-stale=\"true\"]')"
               " && !document.querySelector('[data-testid=\"stSkeleton\"]')")
    for _ in range(2):                  # settled twice in a row: a run that starts late is waited for too
        page.wait_for_function(settled, timeout=120_000)
        page.wait_for_function("() => new Promise(r => setTimeout(() => r(true), 500))")


def test_train_compares_two_cells(page, app_url):
    """Train the LSTM and the GRU on the adding problem with the page's defaults, as a person would: one click, a
    progress bar, then the loss curves, the held-out curves and the table."""
    page.set_viewport_size({"width": 1920, "height": 1080})
    open_page(page, app_url, "Train")
    page.locator(".st-key-train-run").get_by_role("button").click()
    page.get_by_text("Trained 2 cell(s); saved to").wait_for(timeout=180_000)
    wait_until_idle(page)
    for key in ("losses", "metrics"):
        page.locator(f".st-key-train-{key} .js-plotly-plot svg.main-svg").first.wait_for()
    assert_no_exception(page)
    expect(page.locator('[data-testid="stMain"] [data-testid="stDataFrame"]')).to_have_count(1)
