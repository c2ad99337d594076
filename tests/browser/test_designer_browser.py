"""The Designer's node editor driven the way a person would, in headless Chromium.

Load the LSTM preset, add a block from the right-click palette, see the error of the incomplete cell at once
and the block marked on the canvas, draw the missing wire, see the mark go and the equations change, and undo
back to the LSTM. (Every edit on the canvas goes to the app at once: there is no Execute button.)
Every wait polls for what should appear; nothing sleeps.
"""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -r requirements-test.txt)")
expect = sync_api.expect

pytestmark = pytest.mark.browser

LSTM_BLOCKS = 48 + 2            # nodes of the LSTM, and one next-state sink per state
RERUN_S = 30                    # a rerun compiles the plan and writes the DSL: slow on a busy 2-core CI box


def wait_until_idle(page) -> None:
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " && !document.querySelector('[data-stale=\"true\"]')")


def choose_option(page, key: str, option: str, attempts: int = 5) -> None:
    """Open the selectbox of widget `key` and click `option`, until the box shows it. A rerun that lands while the
    list is open (the canvas component reports its value when it mounts, late on a busy machine) closes it or
    draws it afresh under the mouse: then wait for the run to end and open it again, as a person would."""
    combobox = page.locator(f".st-key-{key}").get_by_role("combobox")
    choice = page.get_by_role("option", name=option)
    for _ in range(attempts):
        wait_until_idle(page)
        combobox.click()
        try:
            choice.click(timeout=5_000)
            expect(combobox).to_have_value(option, timeout=RERUN_S * 1000)
            return
        except (AssertionError, sync_api.Error):
            page.keyboard.press("Escape")
    pytest.fail(f"the selectbox '{key}' did not take '{option}' in {attempts} tries; it shows "
                f"{combobox.input_value()!r}")


def load_preset(page, option: str, attempts: int = 3) -> None:
    """Choose a preset and press "Load preset onto the canvas". The toolbar is drawn at the end of a run of the page,
    so while a run is still going (a busy machine) the button is not there yet: wait for the run to end, choose the
    preset again and press, as a person would."""
    button = page.locator(".st-key-designer-load_preset").get_by_role("button")
    for _ in range(attempts):
        choose_option(page, "designer-preset", option)
        try:
            button.click(timeout=RERUN_S * 1000)
            return
        except sync_api.Error:
            wait_until_idle(page)
    pytest.fail(f"the Load preset button did not come back in {attempts} tries after choosing {option!r}")


def main_text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def canvas(page):
    """The Designer's canvas (the cell_canvas component's iframe)."""
    return page.frame_locator('.st-key-designer-editor iframe[title*="cell_canvas"]')


def _top_element(page, point) -> str | None:
    """The tag of the page's element at a point (the canvas's IFRAME where a click reaches the canvas)."""
    return page.evaluate("([x, y]) => { const e = document.elementFromPoint(x, y); return e ? e.tagName : null; }",
                         point)


def _free_point(frame, pane, fx: float, fy: float) -> list[float]:
    """The point (fx, fy) of the pane, or the nearest one on a grid of 5% steps that no block covers: a right-click
    on a block opens no palette (the canvas is not always fitted to the view yet when a test starts clicking, and
    then an empty cell's blocks sit in its top left corner)."""
    boxes = [b for b in (n.bounding_box() for n in frame.locator(".react-flow__node").all()) if b]

    def at(u, v):
        return [pane["x"] + min(max(u, 0.02), 0.98) * pane["width"], pane["y"] + min(max(v, 0.02), 0.98) * pane["height"]]

    def free(x, y):
        return all(not (b["x"] - 12 <= x <= b["x"] + b["width"] + 12 and b["y"] - 12 <= y <= b["y"] + b["height"] + 12)
                   for b in boxes)

    for d in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4):
        for du, dv in ((0, 0), (0, d), (d, 0), (d, d), (0, -d), (-d, 0), (-d, d), (d, -d), (-d, -d)):
            point = at(fx + du, fy + dv)
            if free(*point):
                return point
    return at(fx, fy)


def add_block(page, frame, fx: float, fy: float, category: str, block: str):
    """Right-click the pane at (fx, fy) of its width and height, pick category > block; the new block, found by the
    label the editor gives it (`<block>-1`: the first of its type; ⚠ before it while it is not wired) or the one the
    app gives it when it draws the canvas afresh (`<block>_1 · <block>`)."""
    entry = frame.get_by_role("menuitem", name=category, exact=True)
    item = frame.get_by_role("menuitem", name=block, exact=True)
    # A click that lands while the app reruns (or scrolls the page) opens no menu, and a rerun that redraws the
    # canvas closes an open one: the whole pick is tried again, from an idle app, the pane measured afresh.
    for _attempt in range(6):
        wait_until_idle(page)
        frame.locator(".react-flow__pane").scroll_into_view_if_needed()
        pane = frame.locator(".react-flow__pane").bounding_box()
        point = _free_point(frame, pane, fx, fy)
        if _top_element(page, point) != "IFRAME":         # under the page's sticky header, say: centre the canvas
            frame.locator(".react-flow__pane").evaluate("e => e.scrollIntoView({block: 'center'})")
            pane = frame.locator(".react-flow__pane").bounding_box()
            point = _free_point(frame, pane, fx, fy)
        page.mouse.click(*point, button="right")
        try:
            expect(entry).to_be_visible(timeout=3_000)
            entry.hover(timeout=3_000)
            expect(item).to_be_visible(timeout=3_000)
            item.click(timeout=3_000)
            break
        except (AssertionError, sync_api.TimeoutError):
            page.keyboard.press("Escape")
    else:
        shot = Path(tempfile.mkdtemp(prefix="palette-")) / "page.png"
        page.screenshot(path=str(shot), full_page=True)
        pytest.fail(f"the palette did not give '{category}' > '{block}' in 6 tries: at the last right-click "
                    f"{point} the page had {_top_element(page, point)!r} on top, the canvas "
                    f"{frame.locator('.react-flow__node').count()} blocks and {frame.get_by_role('menuitem').count()} "
                    f"menu items, the pane at {pane}; the page: {shot}")
    # Its label is the canvas's ("gate-1") until the app draws the canvas afresh, which labels it by the name the
    # app gave it ("gate_1 · gate", app/designer/adapter.py): either names the same block.
    named = re.sub(r"\W", "_", block) + "_1 · " + block
    node = frame.locator(".react-flow__node", has_text=re.compile(
        "^(⚠ )?(" + re.escape(f"{block}-1") + "|" + re.escape(named) + ")"))
    expect(node).to_have_count(1, timeout=RERUN_S * 1000)
    return node


_ELEMENT_AT = """(root, [x, y]) => {
  const e = document.elementFromPoint(x, y);
  if (!e) return null;
  const h = e.closest('.react-flow__handle');
  const at = h ? ` @ ${h.dataset.nodeid}/${h.dataset.handleid}` : '';
  return `${e.tagName}.${e.className}${at}`;
}"""
_HANDLE = "h => ` @ ${h.dataset.nodeid}/${h.dataset.handleid}`"


def _under(page, frame, point) -> str:
    """What a press at `point` (page coordinates) would reach: the page's element there and, inside the canvas's
    iframe, the element there with its classes and, on a handle, its block and port
    (e.g. "IFRAME > DIV.react-flow__handle target open @ node__k3x/h")."""
    top = _top_element(page, point)
    if top != "IFRAME":
        return str(top)
    box = page.locator('.st-key-designer-editor iframe[title*="cell_canvas"]').bounding_box()
    inner = frame.locator(":root").evaluate(_ELEMENT_AT, [point[0] - box["x"], point[1] - box["y"]])
    return f"IFRAME > {inner}"


def _centre(box) -> list[float]:
    return [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2]


AUTO_PAN_PX = 48      # React Flow pans the canvas while a wire is dragged within 40 px of its edge (calcAutoPan)


def _port_edge_distances(frame) -> list[float]:
    """Each port's distance (px) from the nearest edge of the canvas's pane (negative: outside it)."""
    return frame.locator(".react-flow").first.evaluate(
        """el => { const p = el.querySelector('.react-flow__pane').getBoundingClientRect();
                   return [...el.querySelectorAll('.react-flow__handle')].map(h => {
                       const r = h.getBoundingClientRect(), x = r.x + r.width / 2, y = r.y + r.height / 2;
                       return Math.min(x - p.left, p.right - x, y - p.top, p.bottom - y); }); }""")


def _off_pane(point, pane, margin: float) -> bool:
    """Whether `point` is outside the pane shrunk by `margin` px on every side."""
    return not (pane["x"] + margin <= point[0] <= pane["x"] + pane["width"] - margin
                and pane["y"] + margin <= point[1] <= pane["y"] + pane["height"] - margin)


def _view_changed(frame, control: str, *handles) -> None:
    """Press one of the canvas's view controls ("fit view", "zoom out") as a person would to bring the blocks in
    from its edges, then wait until the handles stand still (React Flow may animate the view)."""
    button = frame.get_by_role("button", name=control)
    if button.is_disabled():                  # zoomed out as far as the canvas goes: nothing to do
        return
    button.click()
    last = None
    for _ in range(40):
        boxes = [h.bounding_box() for h in handles]
        if boxes == last:
            return
        last = boxes
        frame.locator(":root").evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")


def _wire_labels(frame) -> list[str]:
    """React Flow's label of every wire on the canvas: "Edge from <block id> to <block id>"."""
    return frame.locator(".react-flow__edge").evaluate_all("es => es.map(e => e.getAttribute('aria-label'))")


def connect(page, frame, source, target, attempts: int = 3) -> None:
    """Drag a wire from one handle to another, as a person does with the mouse, and check it ended on `target`.

    The LSTM fills the editor, so a handle is about a pixel wide; a press that misses it moves a
    block instead of starting a wire. Then the handles are measured again and the drag repeated.
    Each drag starts with the app idle (a rerun that changes the page above the canvas would move the
    port under the mouse), and the port is measured again halfway: a wire dropped on a neighbouring port
    would make a different cell than the test means (a port with a wire has the class "wired").
    Before pressing, the test looks at what is under the mouse, as a person sees it: a handle under the page's
    sticky header is scrolled into view, and one covered by another block (a selected block grows by its fields)
    is uncovered by clicking an empty place of the canvas, which clears the selection. Under the press and the
    drop it wants the very handles meant, not a neighbour's (an empty cell's x and h sit close together), and after
    the drop it reads the new wire's ends: a wire between other blocks than meant is undone and drawn again. A handle
    near the canvas's edge is brought in with "zoom out" first (a wire dragged there pans the canvas under the
    mouse), and one panned out of sight by a missed drag with "fit view".
    """
    edges = frame.locator(".react-flow__edge")
    before = edges.count()
    seen = []
    for _ in range(attempts):
        wait_until_idle(page)
        for _look in range(4):
            a, b = _centre(source.bounding_box()), _centre(target.bounding_box())
            pane = frame.locator(".react-flow__pane").bounding_box()
            if any(_off_pane(p, pane, 0) for p in (a, b)):            # panned away (a drag near an edge pans)
                _view_changed(frame, "fit view", source, target)
                continue
            if any(_off_pane(p, pane, AUTO_PAN_PX) for p in (a, b)):  # a drop there would pan the canvas under it
                _view_changed(frame, "zoom out", source, target)
                continue
            under = _under(page, frame, a), _under(page, frame, b)
            meant = source.evaluate(_HANDLE), target.evaluate(_HANDLE)
            if all("react-flow__handle" in u and u.endswith(m) for u, m in zip(under, meant)):
                break
            if any(not u.startswith("IFRAME") for u in under):
                frame.locator(".react-flow__pane").evaluate("e => e.scrollIntoView({block: 'center'})")
            else:
                pane = frame.locator(".react-flow__pane").bounding_box()
                page.mouse.click(*_free_point(frame, pane, 0.5, 0.03))   # clear of the controls and the map
            wait_until_idle(page)
        seen.append(under)
        page.mouse.move(*a)
        page.mouse.down()
        page.mouse.move((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, steps=5)
        b = _centre(target.bounding_box())
        page.mouse.move(*b, steps=5)
        page.mouse.up()
        try:
            expect(edges).to_have_count(before + 1, timeout=2_000)
        except AssertionError:
            continue
        wait_until_idle(page)
        ends = [h.evaluate("h => h.dataset.nodeid") for h in (source, target)]
        if f"Edge from {ends[0]} to {ends[1]}" in _wire_labels(frame):
            break
        seen.append(f"a wire between other blocks: {_wire_labels(frame)}")
        page.get_by_role("button", name="Undo", exact=True).click()
        expect(edges).to_have_count(before, timeout=RERUN_S * 1000)
    else:
        shot = Path(tempfile.mkdtemp(prefix="wire-")) / "page.png"
        page.screenshot(path=str(shot), full_page=True)
        labels = frame.locator(".react-flow__node").all_inner_texts()
        pytest.fail(f"no wire from {source} to {target} in {attempts} drags: under the press and the drop "
                    f"{seen}; {edges.count()} wires, blocks {labels}; the page: {shot}")
    expect(target).to_have_class(re.compile(r"\bwired\b"))


def test_wire_a_new_block_into_the_lstm(page, app_url):
    page.set_viewport_size({"width": 1920, "height": 1200})     # the whole editor on screen, for the mouse
    page.goto(app_url)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Designer", exact=True).click()
    page.locator('[data-testid="stMain"] h1').filter(has_text="Designer").first.wait_for()
    wait_until_idle(page)

    # Load the LSTM preset onto a fresh canvas.
    load_preset(page, "lstm: LSTM (cuDNN / PyTorch)")
    expect(page.get_by_text("Loaded the 'lstm' preset.")).to_be_visible(timeout=RERUN_S * 1000)
    wait_until_idle(page)
    frame = canvas(page)
    expect(frame.locator(".react-flow__node")).to_have_count(LSTM_BLOCKS, timeout=RERUN_S * 1000)
    expect(frame.locator(".react-flow__node", has_text="g · tanh")).to_have_count(1)
    # The fitted view keeps every port out of the 40 px band along the edges where a wire being drawn pans the canvas
    # (the view is fitted a frame after the blocks are drawn: poll); and so does the "fit view" button, which also
    # leaves the minimap its corner.
    for press in (False, True):
        if press:
            frame.get_by_role("button", name="fit view").click()
        deadline = time.monotonic() + 15
        while min(_port_edge_distances(frame)) < 40 and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        distances = _port_edge_distances(frame)
        assert len(distances) > LSTM_BLOCKS and min(distances) >= 40, (press, sorted(distances)[:5])
        minimap = frame.locator(".react-flow__minimap").bounding_box()
        under = [b for b in (n.bounding_box() for n in frame.locator(".react-flow__node").all())
                 if b and b["x"] + b["width"] > minimap["x"] and b["y"] + b["height"] > minimap["y"]]
        assert not under, (press, under[:3])
    equations_before = page.locator('[data-testid="stMain"] .katex').first.inner_text()
    assert "relu" not in equations_before

    # Add a block: right-click an empty place of the canvas (below the inputs), palette category "ops", "relu".
    relu = add_block(page, frame, 0.05, 0.8, "ops", "relu")
    expect(page.get_by_text("node 'relu_1', field 'args.x': port 'x' is not connected")).to_be_visible(
        timeout=RERUN_S * 1000)
    expect(page.get_by_text("The equations appear when the cell is valid.")).to_be_visible(timeout=RERUN_S * 1000)
    expect(relu).to_contain_text("⚠", timeout=RERUN_S * 1000)             # marked in place, with the message
    expect(relu).to_contain_text("port 'x' is not connected")

    # Complete it: a wire from the output of g to the relu's port x.
    connect(page, frame, frame.locator(".react-flow__node", has_text="g · tanh").locator(".react-flow__handle.source"),
            relu.locator(".react-flow__handle.target"))
    expect(page.get_by_text("lstm is a valid cell")).to_be_visible(timeout=RERUN_S * 1000)
    expect(page.get_by_text("node 'relu_1': value is computed but never used")).to_be_visible(
        timeout=RERUN_S * 1000)
    expect(relu).not_to_contain_text("⚠", timeout=RERUN_S * 1000)
    katex = page.locator('[data-testid="stMain"] .katex').first
    expect(katex).to_contain_text("relu", timeout=RERUN_S * 1000)
    assert katex.inner_text() != equations_before

    # Undo twice: the canvas is drawn afresh from the history, without the relu. Each undo's effect is waited for
    # before the next click: a click that lands as the rerun of the one before starts is lost (seen on a 2-core
    # machine under load: 51 blocks, the relu still there, after two clicks in a row).
    undo = page.locator(".st-key-designer-undo").get_by_role("button")
    undo.click()                                   # the wire: the relu's port is open again
    expect(page.get_by_text("node 'relu_1', field 'args.x': port 'x' is not connected")).to_be_visible(
        timeout=RERUN_S * 1000)
    wait_until_idle(page)
    undo.click()                                   # the relu itself
    wait_until_idle(page)
    frame = canvas(page)
    expect(frame.locator(".react-flow__node")).to_have_count(LSTM_BLOCKS, timeout=RERUN_S * 1000)
    expect(frame.locator(".react-flow__node", has_text="relu")).to_have_count(0, timeout=RERUN_S * 1000)
    expect(page.locator('[data-testid="stMain"] .katex').first).not_to_contain_text("relu",
                                                                                  timeout=RERUN_S * 1000)
    assert page.locator('[data-testid="stException"]').count() == 0
