"""The design drawn as a plotly graph, coloured by the compiled plan's groups. Pure: data in, figure out.

Nodes sit where the canvas's automatic layout puts them (app.designer.layout), so the picture beside
the editor reads the same way: x and the states on the left, gates in bands, next states on the right.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import plotly.graph_objects as go
from plotly.colors import qualitative

from ..figures import titled
from .layout import is_automatic_name, layout

UNGROUPED = "#9e9e9e"
PROBLEM = "#d62728"
_PALETTE = qualitative.Plotly + qualitative.D3
_PARAMETER_OPS = ("weight", "bias", "vector", "const")


def _named_nodes(design: dict) -> list[tuple[int, str, str, list[str]]]:
    raw = design.get("nodes") if isinstance(design, dict) else None
    out = []
    for i, entry in enumerate(raw if isinstance(raw, list) else []):
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            args = entry.get("args") if isinstance(entry.get("args"), list) else []
            out.append((i, entry["name"], str(entry.get("op", "")), [a for a in args if isinstance(a, str)]))
    return out


def group_colours(groups: Iterable[str]) -> dict[str, str]:
    """One colour per group, in order of first appearance."""
    ordered = list(dict.fromkeys(groups))
    return {g: _PALETTE[k % len(_PALETTE)] for k, g in enumerate(ordered)}


def plan_figure(design: dict, node_groups: Mapping[str, str], problem_nodes: Iterable[str] = (),
                *, height: int = 520) -> go.Figure:
    """The cell's graph with each node coloured by its plan group (GEMM or fused kernel).

    node_groups: node name -> group name (explain_json's "node_groups"); nodes without a group
    (inputs, states, parameters) are grey. problem_nodes are ringed in red.
    """
    grid = layout(design)
    nodes = _named_nodes(design)
    position = {name: (float(grid.nodes[i][0]), -float(grid.nodes[i][1])) for i, name, _, _ in nodes}
    fig = go.Figure()

    edge_x: list[float | None] = []
    edge_y: list[float | None] = []
    for _, name, _, args in nodes:
        for a in args:
            if a in position:
                (xa, ya), (xb, yb) = position[a], position[name]
                edge_x += [xa, xb, None]
                edge_y += [ya, yb, None]
    states = design.get("states") if isinstance(design.get("states"), list) else []
    sink_x, sink_y, sink_text = [], [], []
    for k, entry in enumerate(states):
        if not isinstance(entry, dict):
            continue
        column, row = grid.sinks[k]
        sink_x.append(float(column))
        sink_y.append(-float(row))
        sink_text.append(f"{entry.get('name')}_t")
        if entry.get("next") in position:
            xa, ya = position[entry["next"]]
            edge_x += [xa, float(column), None]
            edge_y += [ya, -float(row), None]
    fig.add_trace(go.Scatter(x=edge_x, y=edge_y, mode="lines", line=dict(width=1, color="#c8c8c8"),
                             hoverinfo="skip", showlegend=False, name="wires"))

    colours = group_colours(node_groups[name] for _, name, _, _ in nodes if name in node_groups)
    by_group: dict[str | None, list[tuple[str, str]]] = {}
    for _, name, op, _ in nodes:
        by_group.setdefault(node_groups.get(name), []).append((name, op))
    for group, members in sorted(by_group.items(), key=lambda kv: (kv[0] is None, str(kv[0]))):
        fig.add_trace(go.Scatter(
            x=[position[n][0] for n, _ in members], y=[position[n][1] for n, _ in members],
            mode="markers+text", name=group or "no group (inputs, states, parameters)",
            # Only the names a researcher wrote are printed (x, h, i, c_next, ...); the rest on hover.
            text=["" if is_automatic_name(n, op) or op in _PARAMETER_OPS else n for n, op in members],
            textposition="top center", textfont=dict(size=10),
            customdata=[[n, op, group or "-"] for n, op in members],
            hovertemplate="%{customdata[0]} (%{customdata[1]})<br>group: %{customdata[2]}<extra></extra>",
            marker=dict(size=12 if group else 8, color=colours.get(group, UNGROUPED),
                        line=dict(width=0.5, color="white"))))
    if sink_x:
        fig.add_trace(go.Scatter(x=sink_x, y=sink_y, mode="markers+text", name="next states",
                                 text=sink_text, textposition="middle right", hoverinfo="text",
                                 marker=dict(symbol="triangle-right", size=12, color="#444")))
    flagged = [n for n in dict.fromkeys(problem_nodes) if n in position]
    if flagged:
        fig.add_trace(go.Scatter(
            x=[position[n][0] for n in flagged], y=[position[n][1] for n in flagged], mode="markers",
            name="has a problem", text=flagged, hovertemplate="%{text}: see the problems list<extra></extra>",
            marker=dict(size=22, color="rgba(0,0,0,0)", line=dict(width=2.5, color=PROBLEM))))
    fig.update_layout(height=height, margin=dict(l=4, r=4, t=4, b=4), plot_bgcolor="rgba(0,0,0,0)",
                      legend=dict(orientation="h", yanchor="top", y=-0.02, font=dict(size=10)),
                      xaxis=dict(visible=False), yaxis=dict(visible=False, scaleanchor=None))
    return titled(fig, "The cell's nodes, coloured by the GEMM group or fused kernel that computes them")
