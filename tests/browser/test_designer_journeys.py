"""The journeys a new user makes in the Designer, in headless Chromium (issue #9):

1. build a minimal gated cell from scratch on the canvas (New empty cell: x, h and h's next value; a gate, a
   candidate and a lerp from the right-click palette; eight wires drawn), see it validate, see its sample run, save it, reload the page and find both
   the working design and the saved file;
2. break a wire of the LSTM and see the error naming the port, with the node marked on the redrawn canvas; undo.

Every wait polls for what should appear; nothing sleeps.
"""
from __future__ import annotations

import re

import pytest

from test_designer_browser import RERUN_S, canvas, connect, execute, main_text, wait_until_idle

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -r requirements-test.txt)")
expect = sync_api.expect

pytestmark = pytest.mark.browser


def open_designer(page, app_url) -> None:
    page.set_viewport_size({"width": 1400, "height": 1200})
    page.goto(app_url)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Designer", exact=True).click()
    page.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
    wait_until_idle(page)


def add_block(page, frame, x: float, y: float, category: str, block: str):
    """Right-click the pane at (x, y) of its box, pick category > block; the new block, found by the label the
    editor gives it (`<block>-1`: the first of its type)."""
    pane = frame.locator(".react-flow__pane").bounding_box()
    page.mouse.click(pane["x"] + x, pane["y"] + y, button="right")
    frame.get_by_role("menuitem", name=category, exact=True).hover()
    frame.get_by_role("menuitem", name=block, exact=True).click()
    node = frame.locator(".react-flow__node", has_text=re.compile("^" + re.escape(f"{block}-1")))
    expect(node).to_have_count(1)
    return node


def port(node, name: str):
    return node.locator(f'.react-flow__handle.target[data-handleid="{name}"]')


def output(node):
    return node.locator('.react-flow__handle.source[data-handleid="value"]')


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def test_build_a_gated_cell_from_scratch_run_save_and_find_it_after_a_reload(page, app_url):
    open_designer(page, app_url)
    page.locator(".st-key-designer-new").get_by_role("button").click()
    expect(page.get_by_text("Started an empty cell")).to_be_visible(timeout=RERUN_S * 1000)
    wait_until_idle(page)
    frame = canvas(page)
    x = frame.locator(".react-flow__node", has_text="x · input")
    h = frame.locator(".react-flow__node", has_text="h · state")
    sink = frame.locator(".react-flow__node", has_text="h at t")
    expect(frame.locator(".react-flow__node")).to_have_count(3, timeout=RERUN_S * 1000)   # x, h, h's next value
    for _ in range(3):                                  # room for three more blocks around them
        frame.get_by_role("button", name="zoom out").click()
    gate = add_block(page, frame, 20, 20, "building blocks", "gate")
    candidate = add_block(page, frame, 20, 300, "building blocks", "candidate")
    lerp = add_block(page, frame, 350, 330, "building blocks", "lerp")
    for source, target, name in [(x, gate, "x"), (h, gate, "h"), (x, candidate, "x"), (h, candidate, "h"),
                                 (gate, lerp, "z"), (h, lerp, "a"), (candidate, lerp, "b"), (lerp, sink, "next")]:
        connect(page, frame, output(source), port(target, name))
    execute(page, frame)
    expect(page.get_by_text("my_cell is a valid cell")).to_be_visible(timeout=RERUN_S * 1000)

    open_tab(page, "Equations")
    expect(page.locator('[data-testid="stMain"] .katex').first).to_contain_text("gate", timeout=RERUN_S * 1000)
    open_tab(page, "Sample run")
    expect(page.get_by_text("outputs (T, B, H)")).to_be_visible(timeout=RERUN_S * 1000)
    assert "NaN" not in main_text(page)

    open_tab(page, "Files")
    page.locator(".st-key-designer-save_name").get_by_role("textbox").fill("my_gated_cell")
    page.locator(".st-key-designer-save_name").get_by_role("textbox").press("Enter")
    wait_until_idle(page)
    page.locator(".st-key-designer-save").get_by_role("button").click()
    expect(page.get_by_text("my_gated_cell.json")).to_be_visible(timeout=RERUN_S * 1000)

    page.reload()                                       # the URL carries this session's working design
    page.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
    wait_until_idle(page)
    expect(page.get_by_text("my_cell is a valid cell")).to_be_visible(timeout=RERUN_S * 1000)
    expect(canvas(page).locator(".react-flow__node")).to_have_count(6, timeout=RERUN_S * 1000)
    open_tab(page, "Files")
    page.locator(".st-key-designer-saved").get_by_role("combobox").click()
    expect(page.get_by_role("option", name="my_gated_cell")).to_be_visible(timeout=RERUN_S * 1000)
    assert page.locator('[data-testid="stException"]').count() == 0


def test_break_a_wire_see_the_marked_node_and_the_error_then_undo(page, app_url):
    import engine
    open_designer(page, app_url)
    page.locator(".st-key-designer-preset").get_by_role("combobox").click()
    page.get_by_role("option", name="lstm: LSTM (cuDNN / PyTorch)").click()
    page.locator(".st-key-designer-load_preset").get_by_role("button").click()
    expect(page.get_by_text("Loaded the 'lstm' preset.")).to_be_visible(timeout=RERUN_S * 1000)
    wait_until_idle(page)
    frame = canvas(page)
    expect(frame.locator(".react-flow__node")).to_have_count(50, timeout=RERUN_S * 1000)
    # The wire into g = tanh(g_pre): the canvas names it after g's index in the cell JSON and its port.
    g = next(i for i, n in enumerate(engine.to_dict(engine.preset("lstm").cell)["nodes"]) if n["name"] == "g")
    wire = frame.locator(f'[data-testid="rf__edge-edge-{g}-x"]')
    expect(wire).to_have_count(1)
    wire.click(force=True)
    page.keyboard.press("Backspace")
    expect(wire).to_have_count(0)
    execute(page, frame)
    expect(page.get_by_text("node 'g', field 'args.x': port 'x' is not connected")).to_be_visible(
        timeout=RERUN_S * 1000)
    frame = canvas(page)                                 # drawn again, the node at fault marked
    expect(frame.locator(".react-flow__node", has_text="⚠ g · tanh")).to_have_count(1, timeout=RERUN_S * 1000)
    expect(frame.locator(".react-flow__node")).to_have_count(50)

    page.locator(".st-key-designer-undo").get_by_role("button").click()
    wait_until_idle(page)
    expect(page.get_by_text("lstm is a valid cell")).to_be_visible(timeout=RERUN_S * 1000)
    frame = canvas(page)
    expect(frame.locator(f'[data-testid="rf__edge-edge-{g}-x"]')).to_have_count(1, timeout=RERUN_S * 1000)
    expect(frame.locator(".react-flow__node", has_text="⚠")).to_have_count(0)
    assert page.locator('[data-testid="stException"]').count() == 0
