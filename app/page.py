"""Every page's header: the browser tab's title and icon, then the page's title.

    page.header("designer")       # the tab reads "Designer · cellforge", with the page's icon

The table is also st.navigation's (app/main.py), so the sidebar, the tab and the heading say the same.
"""
from __future__ import annotations

import streamlit as st

APP = "cellforge"
PAGES = {   # file stem in app/views -> (title, icon)
    "designer": ("Designer", ":material/schema:"),
    "gallery": ("Gallery", ":material/grid_view:"),
    "schedule": ("Schedule", ":material/view_timeline:"),
    "networks": ("Networks", ":material/stacks:"),
    "benchmarks": ("Benchmarks", ":material/speed:"),
    "divergence": ("Divergence", ":material/show_chart:"),
    "train": ("Train", ":material/model_training:"),
    "export": ("Export", ":material/download:"),
}


def tab_title(page: str) -> str:
    return f"{PAGES[page][0]} · {APP}"


def header(page: str) -> None:
    """Set the browser tab's title and icon for `page` (a page opened alone, without app/main.py, too) and draw
    its title."""
    title, icon = PAGES[page]
    st.set_page_config(page_title=tab_title(page), page_icon=icon, layout="wide")
    st.title(title)
