"""The app: one st.navigation over the pages, and a sidebar that says whether a GPU is there.

Started by `./run app`, which is `streamlit run app/main.py`.

The pages live in app/views/, not app/pages/: Streamlit treats a `pages/` folder beside the entry
point as a legacy multipage app, which would bypass this script on a first deep link.
"""
from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run app/main.py` puts app/ on sys.path, not the repository root the pages import from.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Imported here, fully, before any page runs: plotly looks pandas up in sys.modules without taking
# the import lock, so a page drawing a figure while another script thread (Streamlit's fast rerun
# after a click) is still importing pandas would see a half-initialised module and fail.
import pandas  # noqa: E402, F401
import streamlit as st  # noqa: E402

from app import engine_cache  # noqa: E402

PAGES = [
    st.Page("views/designer.py", title="Designer", icon=":material/schema:", default=True),
    st.Page("views/gallery.py", title="Gallery", icon=":material/grid_view:"),
    st.Page("views/schedule.py", title="Schedule", icon=":material/view_timeline:"),
    st.Page("views/networks.py", title="Networks", icon=":material/stacks:"),
    st.Page("views/benchmarks.py", title="Benchmarks", icon=":material/speed:"),
    st.Page("views/divergence.py", title="Divergence", icon=":material/show_chart:"),
    st.Page("views/train.py", title="Train", icon=":material/model_training:"),
    st.Page("views/export.py", title="Export", icon=":material/download:"),
]


def gpu_sidebar_ui() -> bool:
    ok, reason = engine_cache.gpu_status()
    with st.sidebar:
        if ok:
            st.success("GPU available", icon=":material/memory:")
        else:
            st.info("No GPU: live benchmarks and timelines need a CUDA GPU with CuPy; everything else runs "
                    "on the CPU.", icon=":material/memory:")
        st.caption(reason)
    return ok


st.set_page_config(page_title="RNN cell engine", page_icon=":material/memory:", layout="wide")
page = st.navigation(PAGES)
gpu_sidebar_ui()
page.run()
