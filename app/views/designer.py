"""Designer: wire a cell's gates from primitive ops in a node editor; see its equations, code and plan live.

The canvas is the project's own React Flow component (app/designer/canvas). Every edit on it reaches Python at
once; the page reads the canvas back into cell JSON (app.designer.adapter), makes it the current design
(app.state: undo history, autosave), shows what the engine says about it, and sends the problems back as marks
on the blocks at fault, drawn in place. A design that changes from elsewhere (a preset, undo, a file, the
Gallery) is drawn afresh (a new revision of the canvas).

Tests feed an editor schema (a dict) through st.session_state["designer_payload"] in place of the
canvas's reply; it goes through exactly the same read-back.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# `streamlit run app/views/designer.py` (the page alone) puts only app/views/ on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

import engine  # noqa: E402
from app import engine_cache, page, state  # noqa: E402
from app.designer import adapter, checks, figures, files, palette  # noqa: E402
from app.designer.canvas import cell_canvas  # noqa: E402

PAYLOAD = "designer_payload"          # an editor schema dict standing in for the canvas's reply
_CANVAS = "designer.canvas"           # the drawn canvas (see mount): its revision, schema, edits taken, places, ...
_EDITOR = "designer.editor"           # the canvas component's key (its value: the last edit on it)
_FLASH = "designer.flash"             # messages from callbacks, shown once at the top
_FILES_FLASH = "designer.files_flash"  # the same, shown once in the Files tab
_UPLOADED = "designer.uploaded"       # file_id of the last upload handled


# ---- helpers -------------------------------------------------------------------------------------

def graph_text(design: dict) -> str:
    """What the canvas draws of a design (not its name or doc), as canonical JSON."""
    part = {k: design.get(k) for k in ("nodes", "states", "output")} if isinstance(design, dict) else design
    return json.dumps(part, sort_keys=True, default=str)


def design_text(design: dict) -> str:
    return json.dumps(design, sort_keys=True, default=str)


def problem_markdown(problem) -> str:
    """An engine.Problem as the CLI prints it, with its hint on a line of its own."""
    text = str(problem).replace("$", r"\$")
    return text.replace("\n  hint: ", "  \nhint: ")


def flash(kind: str, message: str, where: str = _FLASH) -> None:
    st.session_state.setdefault(where, []).append((kind, message))


def flash_ui(where: str = _FLASH) -> None:
    for kind, message in st.session_state.pop(where, []):
        getattr(st, kind)(message)


# ---- actions (callbacks run before the script, so the canvas already shows their result) ----------

def load_preset() -> None:
    name = st.session_state.get("designer.preset")
    if name in engine_cache.presets():
        state.set_current_design(engine.to_dict(engine_cache.presets()[name].cell), source="preset")
        redraw()             # also when the design was this preset already: drop edits not yet sent
        flash("success", f"Loaded the '{name}' preset.")


def empty_design(name: str = "my_cell") -> dict:
    """The start of a cell built on the canvas from scratch: what every cell has, its input x, a state h and the
    sink for h's next value, unwired."""
    return {"schema": "rnn-cell-graph", "version": 1, "name": name, "doc": "", "output": "h",
            "nodes": [{"name": "x", "op": "input"}, {"name": "h", "op": "state"}],
            "states": [{"name": "h", "next": ""}]}


def new_empty() -> None:
    state.set_current_design(empty_design(), source="new")
    redraw()
    flash("success", "Started an empty cell: the input x, the state h and h's next value. Right-click the canvas "
          "to add blocks and drag wires between ports (the previous design is one Undo away).")


def rename_cell() -> None:
    design = state.current_design()
    name = str(st.session_state.get("designer.name", "")).strip()
    if not name:        # a cleared field (or a stale empty value from the browser) never wipes the name
        st.session_state["designer.name"] = str(design.get("name", ""))
        flash("warning", f"field 'Cell name': a cell needs a name; kept '{design.get('name', '')}'. "
              "Type a new one and press Enter to rename it.")
        return
    design["name"] = name
    state.set_current_design(design, source="name")


def set_input_is_hidden() -> None:
    design = state.current_design()
    if st.session_state.get("designer.input_is_hidden"):
        design["input_is_hidden"] = True
    else:
        design.pop("input_is_hidden", None)
    state.set_current_design(design, source="input_is_hidden")


def redraw() -> None:
    """Draw the canvas afresh with the automatic layout."""
    st.session_state.pop(_CANVAS, None)


def upload() -> None:
    uploaded = st.session_state.get("designer.upload")
    if uploaded is None or st.session_state.get(_UPLOADED) == uploaded.file_id:
        return
    st.session_state[_UPLOADED] = uploaded.file_id
    design, problems = files.read_design(uploaded.getvalue())
    if design is None:
        flash("error", f"Could not open {uploaded.name}; the current design is kept.\n\n"
              + "\n".join(f"- {problem_markdown(p)}" for p in problems))
        return
    state.set_current_design(design, source="upload")
    flash("success", f"Opened {uploaded.name} ('{design['name']}').")


def load_saved() -> None:
    name = st.session_state.get("designer.saved")
    if not name:
        return
    design, problems = files.load_design(state.designs_dir(), name)
    if design is None:
        flash("error", f"Could not open '{name}'; the current design is kept.\n\n"
              + "\n".join(f"- {problem_markdown(p)}" for p in problems))
        return
    state.set_current_design(design, source="file")
    flash("success", f"Opened the saved design '{name}'.")


def _on_saved(verb: str, action) -> tuple[str, object] | None:
    """Run action(designs folder, chosen saved name); (name, its result), or None after flashing why not."""
    name = st.session_state.get("designer.saved")
    if not name:
        return None
    try:
        return name, action(state.designs_dir(), name)
    except (OSError, ValueError, engine.EngineError) as e:
        flash("error", f"Could not {verb} '{name}': {e}")
        return None


def duplicate_saved() -> None:
    done = _on_saved("duplicate", files.duplicate_design)
    if done:
        name, copy = done
        st.session_state["designer.saved"] = copy
        flash("success", f"Saved a copy of '{name}' as '{copy}'.")


def reopen_last(path: str) -> None:
    design = None
    try:
        design = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        flash("error", f"Could not reopen {path}: {e}; the current design is kept.")
    if isinstance(design, dict):
        state.set_current_design(design, source="reopen")
        flash("success", f"Reopened the last design '{design.get('name', '?')}' ({path}). Undo goes back to the "
              "LSTM preset.")


def reopen_ui() -> None:
    """A fresh visit (the app's address without ?design=) starts a new session from the LSTM preset: offer the
    design last autosaved in the designs folder."""
    if not state.untouched():
        return
    last = state.last_design(exclude=state.working_path())
    if last is None:
        return
    path, design, mtime = last
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime))
    info, button = st.columns([4, 1], vertical_alignment="center")
    info.info(f"A new session starts from the LSTM preset. The last design worked on here, "
              f"**{design.get('name', '?')}** (autosaved {when}), can be reopened.", icon=":material/history:")
    button.button("Reopen the last design", key="designer.reopen", on_click=reopen_last, args=(str(path),),
                  icon=":material/restore:")


def delete_saved() -> None:
    done = _on_saved("delete", files.delete_design)
    if done:
        name, where = done
        st.session_state["designer.saved"] = None
        flash("success", f"Deleted '{name}' from the list (the file is kept as {where}).")


# ---- the canvas ------------------------------------------------------------------------------------
#
# The canvas's state is one plain dict in st.session_state[_CANVAS]: the revision drawn, its schema, the graph it
# shows, the last edit taken and applied, the blocks' names and places, and the canvas's own problems. Every read
# or write of st.session_state is a point where Streamlit may stop the script for the next rerun the browser
# asked for; so taking an edit fetches what it needs first, then marks the edit taken and applies it to the
# design with no session_state access in between (see app.state._store). An edit is never marked taken without
# being applied, and the design never changes without the canvas knowing it already shows that graph.

def mount(design: dict, positions: dict | None = None, problems: tuple | None = None) -> dict:
    """Draw `design` afresh: a new revision of the canvas (the component replaces its graph). positions: where
    the researcher had put blocks (kept), else the automatic layout."""
    number = st.session_state.get("designer.mounts", 0) + 1
    blocks = st.session_state.get("designer.building_blocks", True)
    schema, skipped = adapter.design_to_schema(design, blocks=blocks, positions=positions)
    canvas = {"revision": number, "schema": schema, "graph": graph_text(design), "edit": 0,
              "applied": adapter.canvas_fingerprint(schema), "skipped": skipped, "ids": adapter.block_ids(schema),
              "names": adapter.block_names(schema), "positions": dict(positions or {}),
              "problems": problems or (None, [])}
    st.session_state["designer.mounts"] = number
    st.session_state[_CANVAS] = canvas
    return canvas


def canvas_for(design: dict) -> dict:
    canvas = st.session_state.get(_CANVAS)
    if canvas is None or canvas["graph"] != graph_text(design):
        # Blocks keep their places through undo and redo (and edits on the canvas); a design from elsewhere (the
        # Gallery, a file) is laid out afresh.
        kept = canvas is not None and state.design_source() in ("canvas", "undo", "redo", "name", "input_is_hidden")
        canvas = mount(design, canvas["positions"] if kept else None, canvas["problems"] if kept else None)
    return canvas


def news(canvas: dict, value) -> dict | None:
    """The canvas component's value when it is news: sent by the canvas drawn now (its revision), after the last
    one taken (its edit count)."""
    if (not isinstance(value, dict) or value.get("revision") != canvas["revision"]
            or not isinstance(value.get("edit"), int) or value["edit"] <= canvas["edit"]):
        return None
    return value


def take_canvas_edit(design: dict) -> None:
    """Apply what came back from the canvas since the last run: an edit (an editor schema) becomes the design; an
    undo or redo asked for on the canvas (Ctrl+Z, Ctrl+Shift+Z or Ctrl+Y) moves through the history."""
    canvas = canvas_for(design)
    payload = st.session_state.pop(PAYLOAD, None)
    value = st.session_state.get(_EDITOR)
    change = state.transaction()
    # ---- no st.session_state access below this line: the edit is taken and applied as one step ----
    if payload is None:
        value = news(canvas, value)
        if value is None:
            return
        canvas["edit"] = value["edit"]
        if value.get("command") in ("undo", "redo"):
            getattr(change, value["command"])()
            return
        if isinstance(value.get("refused"), dict):
            canvas["refused"] = refused_wire(canvas, value["refused"])
            return
        payload = value.get("schema")
    payload, renames = adapter.carry_renames(canvas["names"], payload)
    fingerprint = adapter.canvas_fingerprint(payload)
    if fingerprint == canvas["applied"]:
        if isinstance(payload, dict):              # blocks moved, the graph unchanged: only remember where
            canvas["positions"] = adapter.schema_to_design(payload, name="").positions
        return
    reading = adapter.schema_to_design(payload, name=str(design.get("name", "")), doc=str(design.get("doc", "")),
                                       input_is_hidden=design.get("input_is_hidden") is True)
    canvas.pop("refused", None)
    canvas.update(applied=fingerprint, positions=reading.positions, ids=adapter.block_ids(payload),
                  names=adapter.block_names(payload), problems=(design_text(reading.design), reading.problems))
    change.set_design(reading.design, source="canvas")
    if not renames and not adapter.stale_labels(payload):
        canvas["graph"] = graph_text(reading.design)   # the canvas shows this graph already: only new marks
    # else the canvas is drawn afresh (its places kept): its labels, and the next-state blocks' fields, show the
    # new names at once


def refused_wire(canvas: dict, refused: dict) -> str:
    """What the canvas refused to draw (a wire from a block to its own port), in words naming the node."""
    block, port = str(refused.get("block", "")), str(refused.get("port") or "")
    names: dict[str, str] = {}
    for name, block_id in canvas["ids"].items():       # a block's own name comes first (adapter.block_ids)
        names.setdefault(block_id, name)
    name = names.get(block, block)
    return (f"node '{name}': a wire from '{name}' to its own port{f' {port!r}' if port else ''} is refused: a value "
            "cannot be computed from itself within one step. hint: feed it back through a state (its value at t-1): "
            "wire the state's block to this port, and this block to the state's next-state block")


def canvas_ui(design: dict, check: checks.Check) -> None:
    canvas = canvas_for(design)
    canvas["marks"] = adapter.marks(check.problems, canvas["ids"])
    cell_canvas(canvas["schema"], revision=canvas["revision"], marks=canvas["marks"], height=620, key=_EDITOR)
    if canvas["skipped"]:
        st.warning("Not drawn (no block for them): " + ", ".join(canvas["skipped"]))
    if canvas.get("refused"):                  # until the next edit
        st.warning(canvas["refused"])


def canvas_problems(design: dict) -> list:
    text, problems = st.session_state[_CANVAS]["problems"]
    return problems if text == design_text(design) else []


# ---- the page's parts ------------------------------------------------------------------------------

def toolbar_ui(design: dict) -> None:
    presets = engine_cache.presets()
    left, middle, empty, right = st.columns([3, 2, 2, 2], vertical_alignment="bottom")
    with left:
        names = list(presets)
        st.selectbox("Preset", names, index=names.index("lstm") if "lstm" in names else 0, key="designer.preset",
                     format_func=lambda n: f"{n}: {presets[n].title}")
    with middle:
        st.button("Load preset onto the canvas", key="designer.load_preset", on_click=load_preset,
                  icon=":material/input:")
    with empty:
        st.button("New empty cell", key="designer.new", on_click=new_empty, icon=":material/add_box:",
                  help="clear the canvas and build a cell from scratch; Undo brings the previous design back")
    with right:
        undo_col, redo_col = st.columns(2)
        undo_col.button("Undo", key="designer.undo", on_click=state.undo, disabled=not state.can_undo(),
                        icon=":material/undo:")
        redo_col.button("Redo", key="designer.redo", on_click=state.redo, disabled=not state.can_redo(),
                        icon=":material/redo:")
    # The field shows the design's name; typing in it renames the design (rename_cell) before this run.
    if st.session_state.get("designer.name") != str(design.get("name", "")):
        st.session_state["designer.name"] = str(design.get("name", ""))
    st.text_input("Cell name", key="designer.name", on_change=rename_cell)
    tied = design.get("input_is_hidden") is True
    if st.session_state.get("designer.input_is_hidden") != tied:
        st.session_state["designer.input_is_hidden"] = tied
    st.checkbox("Input size = hidden size (x may be combined with hidden-sized values)",
                key="designer.input_is_hidden", on_change=set_input_is_hidden,
                help="for cells such as MUT1 (tanh(x) in the candidate) or residual cells (x + h); the network "
                     "then needs input_size == hidden_size")


def problems_ui(check: checks.Check) -> None:
    if check.problems:
        st.error(f"**The cell is not valid yet.** Problems at: {', '.join(f'`{n}`' for n in check.nodes) or '-'}")
        for problem in check.problems:
            st.error(problem_markdown(problem))
    else:
        st.success(f"**{check.cell.name}** is a valid cell: {len(check.cell.nodes)} nodes, "
                   f"states {', '.join(check.cell.state_names)}, output {check.cell.output}.")
    for warning in check.warnings:
        st.warning(warning)


def equations_ui(cell: engine.CellGraph | None) -> None:
    if cell is None:
        st.info("The equations appear when the cell is valid.")
        return
    st.latex(engine.to_latex(cell))


def code_ui(cell: engine.CellGraph | None) -> None:
    if cell is None:
        st.info("The DSL code appears when the cell is valid.")
        return
    try:
        source = engine_cache.dsl_source(engine.to_json(cell))
    except engine.CellGraphError as e:
        st.error("This cell cannot be written in the DSL.\n\n" + "\n".join(f"- {problem_markdown(p)}"
                                                                             for p in e.problems))
        return
    if source is None:
        st.info("DSL export is not available in this engine.")
        return
    st.code(source, language="python")


def plan_ui(cell: engine.CellGraph | None) -> tuple[dict | None, bool]:
    """The compiled plan: which nodes form each grouped GEMM and each fused kernel. Returns (the plan or None,
    whether the sizes typed are valid)."""
    if cell is None:
        st.info("The plan appears when the cell is valid.")
        return None, True
    fields = engine_cache.SIZE_FIELDS + (("proj_size",) if cell.uses_projection else ())
    sizes = engine_cache.sizes_ui("designer", fields, sets_design_sizes=True)
    if sizes is None:
        return None, False
    try:
        plan = engine_cache.plan(engine.to_json(cell), **sizes)
    except engine.EngineError as e:
        st.error(f"The compiler cannot plan this cell: {e}")
        return None, True
    if plan is None:
        st.info("plan not available yet: this engine has no engine.explain module.")
        return None, True
    a, b, c = st.columns(3)
    a.metric("grouped GEMMs", len(plan.get("gemms", [])))
    b.metric("fused kernels", len(plan.get("kernels", [])))
    c.metric("launches per step", plan.get("launches_per_step", "-"))
    gemm_rows = [{"GEMM": g.get("name"), "stage": str(g.get("stage")),
                  "outputs": ", ".join(str(b.get("output")) for b in g.get("blocks", [])),
                  "matmuls": ", ".join(str(m) for b in g.get("blocks", []) for m in b.get("matmuls", [])),
                  "biases": ", ".join(str(m) for b in g.get("blocks", []) for m in b.get("biases", []))}
                 for g in plan.get("gemms", [])]
    kernel_rows = [{"kernel": k.get("name"), "stage": str(k.get("stage", "")),
                    "nodes": ", ".join(str(n) for n in k.get("nodes", []))} for k in plan.get("kernels", [])]
    st.dataframe(gemm_rows, hide_index=True, key="designer.plan_gemms")
    st.dataframe(kernel_rows, hide_index=True, key="designer.plan_kernels")
    return plan, True


SAMPLE_STEPS, SAMPLE_BATCH = 3, 2       # the sample run: a few steps of a small batch


def try_ui(cell: engine.CellGraph | None, sizes_valid: bool = True) -> None:
    """A small reference run of the current cell: what goes in, what comes out."""
    if cell is None:
        st.info("A sample run appears when the cell is valid.")
        return
    sizes = state.design_sizes()
    shape = {"input_size": int(sizes["input_size"]), "hidden_size": int(sizes["hidden_size"]),
             "num_layers": int(sizes["num_layers"])}
    if not sizes_valid:
        st.warning("The sizes typed in the Plan tab are not valid (see there): this sample run is for the previous "
                   "sizes, " + ", ".join(f"{k} {v}" for k, v in shape.items()) + ".")
    proj_size = int(sizes["proj_size"]) if cell.uses_projection else None
    try:
        problem = engine_cache.memory_problem(cell, "the sample run", **shape, steps=SAMPLE_STEPS,
                                              batch=SAMPLE_BATCH, proj_size=proj_size)
        if problem:
            st.error(problem)
            return
        sample = engine_cache.reference_sample(engine.to_json(cell), **shape, steps=SAMPLE_STEPS,
                                               batch=SAMPLE_BATCH, proj_size=proj_size)
    except engine.EngineError as e:
        st.error(f"The reference run of cell '{cell.name}' failed: {e}")
        return
    st.caption(f"The NumPy reference (float64) on a random input x of shape {tuple(sample['x_shape'])} (T, B, I), "
               "seeded parameters, the plan's sizes.")
    a, b = st.columns(2)
    a.metric(f"outputs (T, B, {cell.output_dim})", " x ".join(map(str, sample["outputs_shape"])))
    b.metric("largest |output|", f"{sample['max_abs']:.4g}")
    st.dataframe([{"final state": name, "shape (L, B, size)": " x ".join(map(str, shape))}
                  for name, shape in sample["final_shapes"].items()], hide_index=True, key="designer.sample_states")
    st.code("outputs[-1, 0, :6] = [" + ", ".join(f"{v:.6g}" for v in sample["first_values"]) + "]",
            language="text")
    if not sample["finite"]:
        st.error("The sample run produced NaN or Inf: check divisions, logs and exponentials in the cell.")


def save_to_designs() -> None:
    """The Save button's action (a callback: it runs before the script, so no rerun can lose the click)."""
    design, cell = state.current_design(), state.current_cell()
    name = str(st.session_state.get("designer.save_name") or "").strip() or str(design.get("name", ""))
    if cell is None:
        flash("error", "field 'Save as': the design is not a valid cell; fix it first (it is autosaved meanwhile)",
              where=_FILES_FLASH)
        return
    problem = files.name_problem(name)
    if problem:
        flash("error", f"field 'Save as': {problem}", where=_FILES_FLASH)
        return
    try:
        path = files.save_design(state.designs_dir(), name, cell)
    except (ValueError, engine.EngineError) as e:
        flash("error", f"Could not save '{name}': {e}", where=_FILES_FLASH)
        return
    flash("success", f"Saved {path}.", where=_FILES_FLASH)


def files_ui(design: dict, cell: engine.CellGraph | None) -> None:
    flash_ui(_FILES_FLASH)
    save_col, open_col = st.columns(2)
    with save_col:
        st.markdown("**Save**")
        if cell is None:
            st.caption(f"Saving needs a valid cell (work in progress is autosaved in `{state.working_path()}`; "
                       "this page's URL brings it back).")
        st.download_button("Download JSON", data=engine.to_json(cell) if cell else "",
                           file_name=f"{design.get('name') or 'cell'}.json", mime="application/json",
                           disabled=cell is None, key="designer.download", icon=":material/download:")
        st.text_input("Save as", key="designer.save_name", placeholder=str(design.get("name", "")),
                      help="a file name in the designs folder; empty: the cell's name")
        st.button("Save to designs/", key="designer.save", disabled=cell is None, icon=":material/save:",
                  on_click=save_to_designs)
    with open_col:
        st.markdown("**Open**")
        st.file_uploader("Upload a cell JSON", type=["json"], key="designer.upload", on_change=upload)
        saved = files.list_designs(state.designs_dir())
        st.selectbox("Saved designs", saved, key="designer.saved", index=None,
                     placeholder="none saved yet" if not saved else "choose one")
        open_button, copy_button, delete_button = st.columns(3)
        open_button.button("Open", key="designer.open_saved", on_click=load_saved, disabled=not saved,
                           icon=":material/folder_open:", help="make the chosen saved design the current one")
        copy_button.button("Duplicate", key="designer.duplicate_saved", on_click=duplicate_saved,
                           disabled=not saved, icon=":material/content_copy:", help="save a copy as <name>-copy")
        delete_button.button("Delete", key="designer.delete_saved", on_click=delete_saved, disabled=not saved,
                             icon=":material/delete:", help="moves the file into designs/.deleted/")


def palette_help_ui() -> None:
    with st.expander("How to edit"):
        st.markdown(
            "- **Right-click** the canvas for the palette: *inputs*, *states* (a state and its *next state* sink), "
            "*parameters* (weight, bias, vector, const), *building blocks* and *ops*.\n"
            "- *Building blocks* are one node each on the canvas: **gate** sigmoid(W x + U h + b) and **candidate** "
            "tanh(W x + U h + b) bring their own weights `W_<name>`, `U_<name>` and bias `b_<name>` (*heads* k: U "
            "as k blocks on its diagonal); **lerp** is z * a + (1 - z) * b; **layer norm** normalizes a value over "
            "the H units, with its gain `g_<name>` and bias `b_<name>`; **exp gates** are sLSTM's exponential "
            "input and forget gates with their stabilizer, three outputs `m_next`, `i`, `f`. A GRU is x, h, two "
            "gates, r * h, a candidate and a lerp; an sLSTM is x, four states, two gates with the identity (its "
            "pre-activations), a candidate, a gate, exp gates and the few ops of c, n and h. In the cell they are "
            "primitive ops (the equations and kernels show them), and they are drawn as one block again.\n"
            "- Drag from a block's output (right) to another block's port (left) to wire it; select a wire or a "
            "block and press Backspace/Delete to remove it; Ctrl+Z / Ctrl+Shift+Z (or Ctrl+Y) on the canvas undo "
            "and redo, as the buttons above do.\n"
            "- Click a block to show its fields (name, sizes, activation, ...); a text field takes effect on Enter or "
            "when you leave it. A new block is named after its label (`sigmoid-2` becomes `sigmoid_2`) until you "
            "type a name.\n"
            "- Every edit is checked at once: blocks at fault turn orange with the message, and the checks, "
            "equations, code and plan below update; the design is autosaved. The buttons at the canvas's bottom "
            "left zoom and fit the whole cell in view; the minimap (bottom right) pans.")
        st.dataframe([{"block": s.type, "group": s.group, "ports": ", ".join(s.inputs) or "-",
                       "outputs": ", ".join(s.outputs) or "-",
                       "fields": ", ".join(o.name for o in s.options), "meaning": s.description}
                      for s in palette.SPECS.values()], hide_index=True, key="designer.palette_table")


# ---- the page --------------------------------------------------------------------------------------

def main() -> None:
    page.header("designer")
    # Elements that come and go live inside containers: the canvas must keep its place in the page
    # from one run to the next, or the browser reloads it and the edits not yet sent are lost.
    with st.container():
        flash_ui()
        if state.notice():
            st.warning(state.notice())
        reopen_ui()
    # Filled after the canvas is read back, so undo/redo and the name reflect this run's edit.
    toolbar = st.container()
    take_canvas_edit(state.current_design())
    design = state.current_design()
    check = checks.check_design(design, canvas_problems(design))
    canvas_ui(design, check)                  # the whole width: the LSTM's 12 columns of blocks stay legible
    editor_col, plan_col = st.columns([3, 2])
    with editor_col:
        buttons = st.columns(2, vertical_alignment="center")
        buttons[0].button("Redraw the canvas (automatic layout)", key="designer.redraw", on_click=redraw,
                          icon=":material/auto_fix_high:")
        buttons[1].toggle("Draw building blocks as one node", value=True, key="designer.building_blocks",
                          on_change=redraw, help="the building blocks (and the same patterns written by hand) as "
                                                 "one node each; off: every primitive op")
        palette_help_ui()
        problems_ui(check)

    equations_tab, code_tab, plan_tab, try_tab, files_tab = st.tabs(
        ["Equations", "DSL code", "Plan", "Sample run", "Files"])
    with files_tab:             # first: nothing the other tabs meet can leave the Files tab empty
        files_ui(design, check.cell)
    with equations_tab:
        equations_ui(check.cell)
    with code_tab:
        code_ui(check.cell)
    with plan_tab:
        plan, sizes_valid = plan_ui(check.cell)
    with try_tab:
        try_ui(check.cell, sizes_valid)
    with toolbar:
        toolbar_ui(design)
    with plan_col:
        st.markdown("**The cell, coloured by plan group**" if plan else "**The cell**")
        st.plotly_chart(figures.plan_figure(design, (plan or {}).get("node_groups", {}), check.nodes),
                        key="designer.plan_figure", config={"displayModeBar": False})
        if plan is None and check.cell is not None:
            st.caption("Colours by GEMM and fused kernel appear when a plan is available.")


main()
