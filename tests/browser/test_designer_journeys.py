"""The journeys a new user makes in the Designer, in headless Chromium at 1920 x 1080 (issue #9):

1. build a minimal gated cell from scratch on the canvas (New empty cell: x, h and h's next value; a gate, a
   candidate and a lerp from the right-click palette; eight wires drawn), see it validate, see its sample run, save
   it, reload the page and find both the working design and the saved file;
2. break a wire of the LSTM and see the error naming the port, with the block marked in place; undo (Ctrl+Z);
3. load the LSTM preset, press "fit view": every block's label is inside the canvas and at least 10 px high.

Every wait polls for what should appear; nothing sleeps.
"""
from __future__ import annotations

import pytest
from test_designer_browser import (
    RERUN_S,
    add_block,
    canvas,
    choose_option,
    connect,
    load_preset,
    main_text,
    wait_until_idle,
)

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -r requirements-test.txt)")
expect = sync_api.expect

pytestmark = pytest.mark.browser


def open_designer(page, app_url) -> None:
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.goto(app_url)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Designer", exact=True).click()
    page.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
    wait_until_idle(page)


def open_the_lstm(page, app_url):
    """The Designer with the LSTM preset loaded onto a fresh canvas; the canvas's frame."""
    open_designer(page, app_url)
    load_preset(page, "lstm: LSTM (cuDNN / PyTorch)")
    expect(page.get_by_text("Loaded the 'lstm' preset.")).to_be_visible(timeout=RERUN_S * 1000)
    wait_until_idle(page)
    return canvas(page)


def port(node, name: str):
    return node.locator(f'.react-flow__handle.target[data-handleid="{name}"]')


def output(node):
    return node.locator('.react-flow__handle.source[data-handleid="value"]')


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def start_empty_cell(page, app_url):
    """The Designer after "New empty cell": (frame, x, h, h's next-value block)."""
    open_designer(page, app_url)
    page.locator(".st-key-designer-new").get_by_role("button").click()
    expect(page.get_by_text("Started an empty cell")).to_be_visible(timeout=RERUN_S * 1000)
    wait_until_idle(page)
    frame = canvas(page)
    expect(frame.locator(".react-flow__node")).to_have_count(3, timeout=RERUN_S * 1000)   # x, h, h's next value
    nodes = frame.locator(".react-flow__node")
    return (frame, nodes.filter(has_text="x · input"), nodes.filter(has_text="h · state"),
            nodes.filter(has_text="h at t"))


def test_build_a_gated_cell_from_scratch_run_save_and_find_it_after_a_reload(page, app_url):
    frame, x, h, sink = start_empty_cell(page, app_url)
    gate = add_block(page, frame, 0.2, 0.1, "building blocks", "gate")       # x, h and the sink sit in the middle
    candidate = add_block(page, frame, 0.2, 0.7, "building blocks", "candidate")
    lerp = add_block(page, frame, 0.75, 0.4, "building blocks", "lerp")
    for source, target, name in [(x, gate, "x"), (h, gate, "h"), (x, candidate, "x"), (h, candidate, "h"),
                                 (gate, lerp, "z"), (h, lerp, "a"), (candidate, lerp, "b"), (lerp, sink, "next")]:
        connect(page, frame, output(source), port(target, name))
    expect(page.get_by_text("my_cell is a valid cell")).to_be_visible(timeout=RERUN_S * 1000)
    lerp.click()                                        # its fields show while it is selected: name it
    lerp.locator("input#name").fill("h_new")
    lerp.locator("input#name").press("Enter")
    open_tab(page, "DSL code")
    expect(page.locator('[data-testid="stMain"] [data-testid="stCode"]').first).to_contain_text(
        "h_new = ", timeout=RERUN_S * 1000)
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
    choose_option(page, "designer-saved", "my_gated_cell")                 # listed, and can be chosen
    expect(page.locator(".st-key-designer-saved").get_by_role("combobox")).to_have_value("my_gated_cell")
    assert page.locator('[data-testid="stException"]').count() == 0


def test_break_a_wire_see_the_marked_node_and_the_error_then_undo(page, app_url):
    import engine
    frame = open_the_lstm(page, app_url)
    expect(frame.locator(".react-flow__node")).to_have_count(50, timeout=RERUN_S * 1000)
    # The wire into g = tanh(g_pre): the canvas names it after g's index in the cell JSON and its port.
    g = next(i for i, n in enumerate(engine.to_dict(engine.preset("lstm").cell)["nodes"]) if n["name"] == "g")
    wire = frame.locator(f'[data-testid="rf__edge-edge-{g}-x"]')
    expect(wire).to_have_count(1)
    wire.click(force=True)
    page.keyboard.press("Backspace")
    expect(wire).to_have_count(0)
    expect(page.get_by_text("node 'g', field 'args.x': port 'x' is not connected")).to_be_visible(
        timeout=RERUN_S * 1000)
    g_block = frame.locator(".react-flow__node", has_text="g · tanh")       # marked in place, with the message
    expect(g_block).to_contain_text("⚠ g · tanh", timeout=RERUN_S * 1000)
    expect(g_block).to_contain_text("port 'x' is not connected")
    expect(frame.locator(".react-flow__node")).to_have_count(50)

    # Undo from the keyboard, on the canvas. A key pressed while a rerun redraws the canvas can be lost: then, once
    # the app is idle again and still shows the broken cell (so no undo is under way), press it again.
    valid = page.get_by_text("lstm is a valid cell")
    for _ in range(3):
        wait_until_idle(page)
        pane = frame.locator(".react-flow__pane").bounding_box()
        page.mouse.click(pane["x"] + 10, pane["y"] + 10)
        page.keyboard.press("Control+z")
        try:
            expect(valid).to_be_visible(timeout=10_000)
            break
        except AssertionError:
            wait_until_idle(page)
            if valid.is_visible():
                break
    expect(valid).to_be_visible(timeout=RERUN_S * 1000)
    wait_until_idle(page)
    frame = canvas(page)
    expect(frame.locator(f'[data-testid="rf__edge-edge-{g}-x"]')).to_have_count(1, timeout=RERUN_S * 1000)
    expect(frame.locator(".react-flow__node", has_text="⚠")).to_have_count(0)
    assert page.locator('[data-testid="stException"]').count() == 0


def test_the_lstm_is_legible_after_fit_view(page, app_url):
    import engine
    frame = open_the_lstm(page, app_url)
    nodes = frame.locator(".react-flow__node")
    expect(nodes).to_have_count(len(engine.preset("lstm").cell.nodes) + 2, timeout=RERUN_S * 1000)
    frame.get_by_role("button", name="zoom in").click()       # away from the fitted view first
    frame.get_by_role("button", name="fit view").click()
    page.wait_for_function("() => true")                      # let the transition's frame land
    expect(frame.locator(".react-flow__viewport")).not_to_have_attribute("style", "", timeout=5_000)
    pane = frame.locator(".react-flow__pane").bounding_box()
    labels = frame.locator(".react-flow__node .label")
    for _ in range(50):                                       # fit view animates: poll until every label is in
        boxes = [labels.nth(i).bounding_box() for i in range(labels.count())]
        inside = [b for b in boxes if b and b["x"] >= pane["x"] and b["y"] >= pane["y"]
                  and b["x"] + b["width"] <= pane["x"] + pane["width"]
                  and b["y"] + b["height"] <= pane["y"] + pane["height"]]
        if len(inside) == len(boxes):
            break
        page.wait_for_timeout(100)
    assert len(inside) == len(boxes) == nodes.count()
    heights = sorted(b["height"] for b in boxes)
    assert heights[0] >= 10, f"the smallest label is {heights[0]:.1f} px high"
    # and the font itself (not only its line box) is at least 10 px on screen
    scale = float(frame.locator(".react-flow__viewport").get_attribute("style").split("scale(")[1].split(")")[0])
    font = float(labels.first.evaluate("e => parseFloat(getComputedStyle(e).fontSize)"))
    assert font * scale >= 10, f"labels are {font} px at zoom {scale:.3f}: {font * scale:.1f} px on screen"


def test_a_building_blocks_field_changes_the_cell(page, app_url):
    """One gate between x, h and h's next value, then its activation picked in its field: the DSL code follows. An
    exp gates block draws its three outputs as rows of their own, each on the block's right edge."""
    frame, x, h, sink = start_empty_cell(page, app_url)
    gate = add_block(page, frame, 0.2, 0.1, "building blocks", "gate")
    for source, target, name in [(x, gate, "x"), (h, gate, "h"), (gate, sink, "next")]:
        connect(page, frame, output(source), port(target, name))
    expect(page.get_by_text("my_cell is a valid cell")).to_be_visible(timeout=RERUN_S * 1000)
    gate.click()
    gate.locator("select#activation").select_option("hard_sigmoid")
    open_tab(page, "DSL code")
    expect(page.locator('[data-testid="stMain"] [data-testid="stCode"]').first).to_contain_text(
        "gate_1 = hard_sigmoid(", timeout=RERUN_S * 1000)
    assert page.locator('[data-testid="stException"]').count() == 0
    gates = add_block(page, frame, 0.75, 0.15, "building blocks", "exp gates")
    # The block and its handles are measured in one call, once its rerun has drawn it at its final width: a block
    # measured mid-render is narrower than its handles' final places.
    measure = """n => {
        const rect = e => { if (!e) return null; const r = e.getBoundingClientRect();
                            return {x: r.x, y: r.y, width: r.width, height: r.height}; };
        return [rect(n), ...['m_next', 'i', 'f'].map(name =>
            rect(n.querySelector(`.react-flow__handle.source[data-handleid="${name}"]`)))];
    }"""
    for _ in range(20):
        wait_until_idle(page)
        box, *handles = gates.evaluate(measure)
        on_edge = all(h and abs(h["x"] + h["width"] / 2 - (box["x"] + box["width"])) < 3 for h in handles)
        if on_edge:
            break
        page.wait_for_timeout(250)
    assert on_edge, (box, handles)
    rows = [h["y"] for h in handles]
    assert rows == sorted(rows) and min(b - a for a, b in zip(rows, rows[1:])) >= 8, rows


def test_rename_a_state_refuse_a_self_loop_bad_sizes_and_reopen_the_last_design(page, app_url, browser):
    """The designer's traps, one journey: a state renamed on the canvas carries through (its next-value block
    follows, the labels change without Redraw, the cell stays valid); a wire from a block to its own port is
    refused in words; a size typed wrong is refused naming the field and kept across a page change, the sample run
    saying it is for the previous sizes; a size too big for the sample run is refused with its memory figure and
    the Files tab stays whole; a fresh visit offers to reopen the last design."""
    frame, x, h, sink = start_empty_cell(page, app_url)
    relu = add_block(page, frame, 0.75, 0.4, "ops", "relu")
    for source, target, name in [(h, relu, "x"), (relu, sink, "next")]:
        connect(page, frame, output(source), port(target, name))
    expect(page.get_by_text("my_cell is a valid cell")).to_be_visible(timeout=RERUN_S * 1000)

    h.click()                                           # rename the state h to s in its name field
    h.locator("input#name").fill("s")
    h.locator("input#name").press("Enter")
    nodes = canvas(page).locator(".react-flow__node")
    expect(nodes.filter(has_text="s · state")).to_have_count(1, timeout=RERUN_S * 1000)    # no Redraw needed
    expect(nodes.filter(has_text="s at t")).to_have_count(1, timeout=RERUN_S * 1000)
    expect(page.get_by_text("my_cell is a valid cell: 3 nodes, states s, output s")).to_be_visible(
        timeout=RERUN_S * 1000)
    open_tab(page, "DSL code")
    expect(page.locator('[data-testid="stMain"] [data-testid="stCode"]').first).to_contain_text(
        "def my_cell(x, s):", timeout=RERUN_S * 1000)

    wait_until_idle(page)
    frame = canvas(page)
    relu = frame.locator(".react-flow__node", has_text="relu_1")
    refused = page.get_by_text("a wire from 'relu_1' to its own port 'x' is refused")
    for _ in range(3):                                  # a wire from the relu to its own port (a drag may miss it)
        wait_until_idle(page)
        frame.locator(".react-flow__pane").evaluate("e => e.scrollIntoView({block: 'center'})")   # the tab scrolled
        a, b = output(relu).bounding_box(), port(relu, "x").bounding_box()
        page.mouse.move(a["x"] + a["width"] / 2, a["y"] + a["height"] / 2)
        page.mouse.down()
        page.mouse.move(a["x"] + 40, a["y"] - 60, steps=5)
        page.mouse.move(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2, steps=5)
        page.mouse.up()
        try:
            expect(refused).to_be_visible(timeout=RERUN_S * 1000 // 3)
            break
        except AssertionError:
            continue
    expect(refused).to_be_visible()
    expect(frame.locator(".react-flow__edge")).to_have_count(2)               # not drawn
    expect(page.get_by_text("my_cell is a valid cell")).to_be_visible()

    fresh = browser.new_context(viewport={"width": 1920, "height": 1080})     # the app's address, a new visit
    try:
        other = fresh.new_page()
        other.set_default_timeout(60_000)
        other.goto(app_url)
        other.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
        wait_until_idle(other)
        expect(other.get_by_text("my_cell", exact=False).first).to_be_visible(timeout=RERUN_S * 1000)
        other.locator(".st-key-designer-reopen").get_by_role("button").click()
        expect(other.get_by_text("my_cell is a valid cell: 3 nodes, states s, output s")).to_be_visible(
            timeout=RERUN_S * 1000)
    finally:
        fresh.close()

    load_preset(page, "lstm: LSTM (cuDNN / PyTorch)")                             # a cell with weights
    expect(page.get_by_text("Loaded the 'lstm' preset.")).to_be_visible(timeout=RERUN_S * 1000)
    wait_until_idle(page)
    hidden = page.locator(".st-key-designer-hidden_size").get_by_role("textbox")
    open_tab(page, "Plan")
    hidden.fill("65536")
    hidden.press("Enter")
    open_tab(page, "Sample run")
    expect(page.get_by_text("more than the limit of")).to_be_visible(timeout=RERUN_S * 1000)
    open_tab(page, "Files")
    expect(page.locator(".st-key-designer-save").get_by_role("button")).to_be_visible()
    open_tab(page, "Plan")
    hidden.fill("12abc")
    hidden.press("Enter")
    expect(page.get_by_text("hidden_size: '12abc' typed in 'hidden size (H)' is not a whole number")).to_be_visible(
        timeout=RERUN_S * 1000)
    open_tab(page, "Sample run")
    expect(page.get_by_text("this sample run is for the previous sizes")).to_be_visible(timeout=RERUN_S * 1000)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Schedule", exact=True).click()
    page.locator('[data-testid="stMain"] h1').filter(has_text="Schedule").first.wait_for()
    wait_until_idle(page)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Designer", exact=True).click()
    page.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
    wait_until_idle(page)
    open_tab(page, "Plan")
    expect(page.locator(".st-key-designer-hidden_size").get_by_role("textbox")).to_have_value("12abc")
    assert page.locator('[data-testid="stException"]').count() == 0

