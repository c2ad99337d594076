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

from app import engine_cache, page  # noqa: E402

PAGES = [st.Page(f"views/{stem}.py", title=title, icon=icon, default=stem == "designer")
         for stem, (title, icon) in page.PAGES.items()]


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


st.set_page_config(page_title=page.APP, page_icon=":material/memory:", layout="wide")
chosen = st.navigation(PAGES)
gpu_sidebar_ui()
chosen.run()
