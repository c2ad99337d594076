"""Gallery: one card per preset, with its equations, citation, cuDNN support and a picture of its graph.

From a card the researcher opens the cell in the Designer or benchmarks it.
"""
from __future__ import annotations

import sys
from pathlib import Path

# Run alone (a first visit straight to this page's URL, see app/main.py), only app/ is on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

import engine  # noqa: E402
from app import engine_cache, figures, page, state  # noqa: E402

CARDS_PER_ROW = 2
# The Benchmarks page reads this request once, to pre-select presets in its own widget.
BENCH_REQUEST = "benchmarks.request_presets"


def filter_ui(presets: dict[str, engine.Preset]) -> tuple[list[str], str]:
    families = sorted({p.family for p in presets.values()})
    left, right = st.columns([2, 1])
    chosen = left.multiselect("Families", families, default=families, key="gallery.families")
    text = right.text_input("Search", key="gallery.search", placeholder="name, title or citation")
    return chosen, text.strip().lower()


def matches(preset: engine.Preset, families: list[str], text: str) -> bool:
    if preset.family not in families:
        return False
    return not text or any(text in s.lower() for s in (preset.name, preset.title, preset.citation))


def card_ui(preset: engine.Preset) -> str | None:
    """One preset's card. Returns "open" or "bench" when a button was pressed."""
    with st.container(border=True):
        st.markdown(f"**{preset.title}**")
        st.caption(f"`{preset.name}` · family {preset.family}")
        st.latex(r"\small " + preset.latex)
        if preset.cudnn:
            st.markdown(f":green-badge[:material/check: cuDNN mode `{preset.cudnn}`]")
        else:
            st.markdown(":gray-badge[no cuDNN equivalent]")
        cell = preset.cell
        st.plotly_chart(figures.cell_graph_figure(cell.nx, [(s.name, s.next) for s in cell.states], height=180),
                        key=f"gallery.graph.{preset.name}", config={"displayModeBar": False})
        st.caption(preset.citation)
        left, right = st.columns(2)
        if left.button("Open in Designer", key=f"gallery.open.{preset.name}", icon=":material/edit:"):
            return "open"
        if right.button("Benchmark", key=f"gallery.bench.{preset.name}", icon=":material/speed:"):
            return "bench"
    return None


def open_in_designer(preset: engine.Preset) -> None:
    state.set_current_design(engine.to_dict(preset.cell), source="gallery")
    st.switch_page("views/designer.py")


def benchmark(preset: engine.Preset) -> None:
    st.session_state[BENCH_REQUEST] = [preset.name]
    st.switch_page("views/benchmarks.py")


page.header("gallery")
st.caption("Every preset cell: the equations are generated from the graph, so they are what runs.")
all_presets = engine_cache.presets()
families, text = filter_ui(all_presets)
shown = [p for p in all_presets.values() if matches(p, families, text)]
if not shown:
    st.info("No preset matches the filter.")
for start in range(0, len(shown), CARDS_PER_ROW):
    for column, preset in zip(st.columns(CARDS_PER_ROW), shown[start:start + CARDS_PER_ROW]):
        with column:
            action = card_ui(preset)
        if action == "open":
            open_in_designer(preset)
        elif action == "bench":
            benchmark(preset)
