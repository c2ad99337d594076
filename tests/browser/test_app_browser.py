"""The app driven the way a person would: headless Chromium against `streamlit run app/main.py`.

Every wait polls for what should appear (a heatmap, a button, a finished run); nothing sleeps.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import engine

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -r requirements-test.txt)")
expect = sync_api.expect

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "screenshots"       # the README shows them
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


def test_app_opens_with_every_page(page, app_url):
    page.goto(app_url)
    nav = page.locator('[data-testid="stSidebarNav"]')
    nav.wait_for()
    for title in PAGES:
        expect(nav.get_by_text(title, exact=True)).to_have_count(1)
    page.locator('[data-testid="stMain"] h1').first.wait_for()
    wait_until_idle(page)
    assert_no_exception(page)


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
    assert download.suggested_filename.endswith(".cu")
    source = Path(download.path()).read_text()
    assert "__global__" in source, source[:500]
    assert_no_exception(page)


def test_readme_screenshot_of_the_designer_with_the_lstm(page, app_url):
    """Load the LSTM from the Gallery into the Designer, as a person would, and photograph it (the README's
    first picture) at 1920 x 1080, the canvas fitted to the cell."""
    page.set_viewport_size({"width": 1920, "height": 1080})
    open_page(page, app_url, "Gallery")
    page.locator(".st-key-gallery-open-lstm").get_by_role("button").click()
    page.wait_for_url(lambda url: "gallery" not in url)
    page.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
    wait_until_idle(page)
    # the canvas (a component iframe) has drawn one block per node of the LSTM and one per state
    frame = page.frame_locator('[data-testid="stMain"] iframe[title*="cell_canvas"]')
    blocks = frame.locator(".react-flow__node")
    lstm = engine.preset("lstm").cell
    expect(blocks).to_have_count(len(lstm.nodes) + len(lstm.state_names), timeout=60_000)
    frame.get_by_role("button", name="fit view").click()
    assert_no_exception(page)
    assert "lstm" in page.locator('[data-testid="stMain"]').inner_text().lower()
    page.locator('[data-testid="stMain"] h1').first.scroll_into_view_if_needed()   # the Gallery click scrolled
    page.wait_for_function("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "designer.png"))
    assert (SCREENSHOTS / "designer.png").stat().st_size > 10_000


def test_train_compares_two_cells_and_is_photographed(page, app_url):
    """Train the LSTM and the GRU on the adding problem with the page's defaults, as a person would: one click, a
    progress bar, then the loss curves, the held-out curves and the table; the picture goes to the README."""
    page.set_viewport_size({"width": 1920, "height": 1080})
    open_page(page, app_url, "Train")
    page.locator(".st-key-train-run").get_by_role("button").click()
    page.get_by_text("Trained 2 cell(s); saved to").wait_for(timeout=180_000)
    wait_until_idle(page)
    for key in ("losses", "metrics"):
        page.locator(f".st-key-train-{key} .js-plotly-plot svg.main-svg").first.wait_for()
    assert_no_exception(page)
    expect(page.locator('[data-testid="stMain"] [data-testid="stDataFrame"]')).to_have_count(1)
    page.locator(".st-key-train-losses").scroll_into_view_if_needed()
    page.wait_for_function("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "train.png"))
    assert (SCREENSHOTS / "train.png").stat().st_size > 10_000


@pytest.mark.parametrize("title", [p for p in PAGES if p not in ("Designer", "Train")])
def test_every_other_page_renders_and_is_photographed(page, app_url, title):
    """Each page opened fresh at 1920 x 1080 shows no exception; its picture goes to docs/screenshots/."""
    page.set_viewport_size({"width": 1920, "height": 1080})
    open_page(page, app_url, title)
    settled = ("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
               " && !document.querySelector('[data-stale=\"true\"]')"
               " && !document.querySelector('[data-testid=\"stSkeleton\"]')")
    for _ in range(2):                  # settled twice in a row: a run that starts late is waited for too
        page.wait_for_function(settled, timeout=120_000)
        page.wait_for_function("() => new Promise(r => setTimeout(() => r(true), 500))")
    charts = page.locator('[data-testid="stMain"] .js-plotly-plot')
    for k in range(charts.count()):
        charts.nth(k).locator("svg.main-svg").first.wait_for()
    assert_no_exception(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{title.lower()}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
