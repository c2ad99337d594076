"""Pure figure functions: results in, a plotly Figure out. No streamlit, no engine calls.

Each function takes plain data that the engine returned (a networkx graph, a wavefront grid, rows of
benchmark results, per-step error arrays) so the pages stay thin and the figures are testable alone.
"""
from __future__ import annotations

import csv
import io
import math
from typing import Iterable, Mapping, Sequence

import networkx as nx
import plotly.graph_objects as go

from engine.bench.nets import blocks_label

# One colour per kind of node, so a cell's picture reads the same in every card.
NODE_COLOURS = {
    "input": "#1f77b4",
    "state": "#9467bd",
    "param": "#7f7f7f",
    "const": "#bcbd22",
    "matmul": "#d62728",
    "elementwise": "#2ca02c",
}
PARAM_OPS = ("weight", "bias", "vector")
LEGEND_ON_TOP = dict(orientation="h", yanchor="bottom", y=1.02, x=0)   # clear of the x axis title
# Plotly's default qualitative colours, named so that one cell keeps its colour across a page's figures.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def titled(fig: go.Figure, text: str) -> go.Figure:
    """A title at the top left, with room above the plot (and its legend) for it."""
    top = (fig.layout.margin.t if fig.layout.margin and fig.layout.margin.t is not None else 40)
    fig.update_layout(title=dict(text=text, x=0, xanchor="left", y=0.99, yanchor="top", font=dict(size=14)),
                      margin=dict(t=top + 36))
    return fig


def node_kind(op: str) -> str:
    if op in PARAM_OPS:
        return "param"
    if op in ("input", "state", "const", "matmul"):
        return op
    return "elementwise"


def layered_positions(graph: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """x = topological generation (data flows left to right), y = rank within the column.

    Leaves (inputs, states, parameters) move right to just before their first consumer, so a weight
    sits beside the matmul that reads it instead of in one tall column at the left edge.
    """
    column: dict[str, int] = {}
    for x, generation in enumerate(nx.topological_generations(graph)):
        for name in generation:
            column[name] = x
    for name in graph.nodes:
        consumers = list(graph.successors(name))
        if graph.in_degree(name) == 0 and consumers:
            column[name] = min(column[c] for c in consumers) - 1
    by_column: dict[int, list[str]] = {}
    for name in sorted(column):
        by_column.setdefault(column[name], []).append(name)
    positions: dict[str, tuple[float, float]] = {}
    for x, names in by_column.items():
        for rank, name in enumerate(names):
            positions[name] = (float(x), rank - (len(names) - 1) / 2.0)
    return positions


def cell_graph_figure(graph: nx.DiGraph, feedback: Iterable[tuple[str, str]] = (), *, height: int = 260,
                      labels: bool = False) -> go.Figure:
    """A small picture of a cell graph (CellGraph.nx). feedback: (state, next value) pairs, drawn dotted
    from the next value back to the state it becomes at the following step."""
    positions = layered_positions(graph)
    fig = go.Figure()
    edge_x: list[float | None] = []
    edge_y: list[float | None] = []
    for a, b in graph.edges:
        (xa, ya), (xb, yb) = positions[a], positions[b]
        edge_x += [xa, xb, None]
        edge_y += [ya, yb, None]
    fig.add_trace(go.Scatter(x=edge_x, y=edge_y, mode="lines", line=dict(width=1, color="#b0b0b0"),
                             hoverinfo="skip", showlegend=False, name="edges"))
    back_x: list[float | None] = []
    back_y: list[float | None] = []
    for state, nxt in feedback:
        if state in positions and nxt in positions:
            (xs, ys), (xn, yn) = positions[state], positions[nxt]
            back_x += [xn, xs, None]
            back_y += [yn, ys, None]
    if back_x:
        fig.add_trace(go.Scatter(x=back_x, y=back_y, mode="lines", hoverinfo="skip", name="state at t+1",
                                 line=dict(width=1, color=NODE_COLOURS["state"], dash="dot"), showlegend=False))
    by_kind: dict[str, list[str]] = {}
    for name, data in graph.nodes(data=True):
        by_kind.setdefault(node_kind(data.get("op", "")), []).append(name)
    for kind, names in by_kind.items():
        fig.add_trace(go.Scatter(
            x=[positions[n][0] for n in names], y=[positions[n][1] for n in names],
            mode="markers+text" if labels else "markers", name=kind,
            text=names, textposition="top center", textfont=dict(size=9),
            customdata=[graph.nodes[n].get("op", "") for n in names],
            hovertemplate="%{text} (%{customdata})<extra></extra>",
            marker=dict(size=9, color=NODE_COLOURS[kind], line=dict(width=0.5, color="white"))))
    fig.update_layout(height=height, margin=dict(l=4, r=4, t=4, b=4), showlegend=False,
                      xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="rgba(0,0,0,0)")
    titled(fig, "Cell graph: inputs and states (t-1) on the left, next states on the right; dashed: back to t+1")
    return fig


def wavefront_heatmap(grid: Sequence[Sequence[int]], *, first_step: int = 0, highlight: int | None = None) -> go.Figure:
    """L x T heatmap of layer-steps, coloured and labelled by their wavefront step.

    grid[l][t] = k (Wavefront.to_dict()["grid"]): layer l at time step t runs in wavefront step k.
    first_step offsets the time axis when the grid shows a window of a longer sequence. highlight=k rings
    the layer-steps of wavefront step k (what runs together, in one launch or between two barriers).
    """
    num_layers = len(grid)
    num_steps = len(grid[0]) if num_layers else 0
    steps = list(range(first_step, first_step + num_steps))
    fig = go.Figure(go.Heatmap(
        z=[list(row) for row in grid], x=steps, y=list(range(num_layers)),
        text=[[str(k) for k in row] for row in grid], texttemplate="%{text}" if num_steps <= 64 else None,
        colorscale="Viridis", colorbar=dict(title="wavefront step"), xgap=1, ygap=1,
        hovertemplate="layer %{y}, time step %{x}: wavefront step %{z}<extra></extra>"))
    fig.update_layout(
        xaxis=dict(title="time step t", dtick=1 if num_steps <= 32 else None),
        yaxis=dict(title="layer", dtick=1, autorange="reversed"),
        height=max(220, 40 * num_layers + 120), margin=dict(l=40, r=20, t=30, b=40))
    if highlight is not None:
        cells = [(t, layer) for layer, row in enumerate(grid) for t, k in enumerate(row) if k == highlight]
        fig.add_trace(go.Scatter(
            x=[steps[t] for t, _ in cells], y=[layer for _, layer in cells], mode="markers", name="running now",
            marker=dict(symbol="square-open", size=22, color="#e45756", line=dict(width=3)), showlegend=False,
            hovertemplate=f"wavefront step {highlight}: layer %{{y}} at time step %{{x}}<extra></extra>"))
    titled(fig, "Dependency diagonals: the wavefront step that runs each (layer, time step)")
    return fig


def speedup_bars(rows: Sequence[Mapping], *, title: str = "") -> go.Figure:
    """Grouped bars of speedup per configuration against each baseline, with a dashed 1x line.

    rows: {"config": label, "baseline": "naive" | "PyTorch eager" | "cuDNN" | ..., "speedup": baseline
    time / engine time}. Bars above the dashed line beat that baseline; the line is parity with cuDNN.
    """
    configs = list(dict.fromkeys(r["config"] for r in rows))
    baselines = list(dict.fromkeys(r["baseline"] for r in rows))
    fig = go.Figure()
    for baseline in baselines:
        values = {r["config"]: r["speedup"] for r in rows if r["baseline"] == baseline}
        ys = [values.get(c) for c in configs]
        fig.add_trace(go.Bar(name=f"vs {baseline}", x=configs, y=ys,
                             text=[f"{y:.2f}x" if y is not None else "" for y in ys], textposition="outside",
                             hovertemplate="%{x}: %{y:.2f}x<extra>vs " + baseline + "</extra>"))
    parity = "1x: cuDNN parity" if any("cudnn" in b.lower() for b in baselines) else "1x: parity"
    fig.add_hline(y=1.0, line_dash="dash", line_color="black", annotation_text=parity,
                  annotation_position="top right")
    fig.update_layout(barmode="group", yaxis=dict(title="speedup (x, higher is better)"),
                      xaxis=dict(title="configuration"),
                      legend=dict(orientation="h"), margin=dict(l=40, r=20, t=20, b=40))
    titled(fig, title or "Speedup over the chosen baselines (baseline time / this time)")
    return fig


def vs_cudnn_bars(rows: Sequence[Mapping], label: Sequence[str], speedup: str) -> list[dict]:
    """speedup_bars rows of every timed row but cuDNN's own: its `label` fields joined as the bar's name, its
    `speedup` field (cuDNN fp32 time / its time) as the bar."""
    return [{"config": " · ".join(str(r[k]) for k in label), "baseline": "cuDNN fp32", "speedup": r[speedup]}
            for r in rows if r["status"] == "ok" and r[speedup] is not None and r["implementation"] != "cudnn-fp32"]


def divergence_figure(series: Sequence[Mapping], *, ylabel: str = "max |error|",
                      title: str | None = None) -> go.Figure:
    """Error against time step on a log axis, one line per series {"label", "errors": per-step values}.

    Exact zeros have no place on a log axis; they are left as gaps rather than clipped to a made-up
    floor (the page says how many steps matched exactly).
    """
    fig = go.Figure()
    for s in series:
        errors = [float(e) if e is not None and math.isfinite(float(e)) and float(e) > 0 else None
                  for e in s["errors"]]
        fig.add_trace(go.Scatter(x=list(range(len(errors))), y=errors, mode="lines", name=s["label"],
                                 line=dict(dash=s.get("dash", "solid")), connectgaps=False,
                                 hovertemplate="t=%{x}: %{y:.3e}<extra>" + s["label"] + "</extra>"))
    fig.update_layout(xaxis=dict(title="time step t"), yaxis=dict(title=ylabel, type="log", exponentformat="e"),
                      legend=LEGEND_ON_TOP,
                      margin=dict(l=40, r=20, t=40, b=40))
    titled(fig, title or "Error per time step against the reference")
    return fig


def timeline_figure(events: Sequence[Mapping]) -> go.Figure:
    """A Gantt chart of measured stages: {"name", "lane", "start_ms", "end_ms"} per event.

    lane is what the stage ran on (a stream, or a stage kind); bars are horizontal from start to end.
    """
    fig = go.Figure()
    names = list(dict.fromkeys(e["name"] for e in events))
    for name in names:
        mine = [e for e in events if e["name"] == name]
        fig.add_trace(go.Bar(
            name=name, orientation="h", y=[str(e["lane"]) for e in mine],
            x=[e["end_ms"] - e["start_ms"] for e in mine], base=[e["start_ms"] for e in mine],
            hovertemplate="%{base:.3f} ms + %{x:.3f} ms<extra>" + name + "</extra>"))
    fig.update_layout(barmode="overlay", xaxis=dict(title="time (ms)"),
                      yaxis=dict(title="stream or stage kind", autorange="reversed"),
                      legend=LEGEND_ON_TOP,
                      margin=dict(l=40, r=20, t=40, b=40),
                      height=max(220, 30 * len({str(e["lane"]) for e in events}) + 120))
    titled(fig, "Measured timeline of one run (ms from its start)")
    return fig


def pipeline_figure(events: Sequence[Mapping], *, title: str = "Predicted pipeline: each GPU's work on each chunk"
                    ) -> go.Figure:
    """A Gantt chart of a pipelined net (engine.multigpu.PipelinePlan.timeline()): one lane and colour per GPU,
    one bar per chunk, {"lane", "chunk", "steps": (first, end), "start_ms", "end_ms"} per event."""
    fig = go.Figure()
    lanes = list(dict.fromkeys(e["lane"] for e in events))
    for lane in lanes:
        mine = [e for e in events if e["lane"] == lane]
        fig.add_trace(go.Bar(
            name=lane, orientation="h", y=[lane] * len(mine), x=[e["end_ms"] - e["start_ms"] for e in mine],
            base=[e["start_ms"] for e in mine], text=[str(e["chunk"]) for e in mine], textposition="inside",
            marker=dict(line=dict(color="white", width=1)),
            customdata=[[e["chunk"], e["steps"][0], e["steps"][1] - 1] for e in mine],
            hovertemplate="chunk %{customdata[0]} (steps %{customdata[1]}-%{customdata[2]}): %{base:.3f} ms + "
                          "%{x:.3f} ms<extra>" + lane + "</extra>"))
    fig.update_layout(barmode="overlay", xaxis=dict(title="time (ms, predicted)"),
                      yaxis=dict(title="GPU", autorange="reversed"), legend=LEGEND_ON_TOP,
                      margin=dict(l=40, r=20, t=40, b=40), height=max(220, 40 * len(lanes) + 140))
    titled(fig, title)
    return fig


def si(value: float, unit: str = "") -> str:
    """1.5e9, "FLOP" -> "1.50 GFLOP": the numbers next to the figures, readable at a glance."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:g} {unit}".rstrip()


def _stage_order(stage) -> tuple[int, int]:
    # "hoisted" work runs once per sequence, before the first step's stage 0
    return (0, 0) if stage == "hoisted" else (1, int(stage))


def plan_stage_table(plan: Mapping) -> list[dict]:
    """What runs where: one row per GEMM (per layer, where the plan gives per-layer shapes) and per
    fused kernel of an explain_json() plan. Hoisted work first, then the plan's order within a step."""
    launch_order = {(item["kind"], item["name"]): i for i, item in enumerate(plan.get("step_order", []))}
    rows = []
    for g in plan.get("gemms", []):
        outputs = ", ".join(b["output"] for b in g.get("blocks", []))
        for shape in g.get("shapes") or [dict(g, layer="all")]:
            # one type per column (text): a table mixing "all" and layer numbers does not convert to Arrow
            rows.append({"stage": str(g["stage"]), "kind": "GEMM", "name": g["name"], "layer": str(shape.get("layer")),
                         "per": shape.get("per", ""), "calls": shape.get("calls"),
                         "shape": f"{shape['m']} x {shape['n']} x {shape['k']}",
                         "reads": ", ".join(g.get("operands", [])), "writes": outputs, "FLOPs": shape.get("flops"),
                         "_order": (_stage_order(g["stage"]), launch_order.get(("gemm", g["name"]), 0))})
    for k in plan.get("kernels", []):
        rows.append({"stage": str(k["stage"]), "kind": "kernel", "name": k["name"], "layer": "all", "per": "step",
                     "calls": None, "shape": f"{len(k.get('nodes', []))} fused ops",
                     "reads": ", ".join(k.get("inputs", [])), "writes": ", ".join(k.get("outputs", [])),
                     "FLOPs": None, "_order": (_stage_order(k["stage"]), launch_order.get(("kernel", k["name"]), 0))})
    rows.sort(key=lambda r: (r["_order"], r["kind"] != "GEMM", r["layer"]))
    for r in rows:
        del r["_order"]
    return rows


def stage_launches_figure(plan: Mapping) -> go.Figure:
    """Stacked bars: GEMM and kernel launches of one layer in each stage of a plan (hoisted = once per
    sequence, or once per chunk of steps for layers after the first)."""
    stages = sorted({g["stage"] for g in plan.get("gemms", [])} | {k["stage"] for k in plan.get("kernels", [])},
                    key=_stage_order)
    labels = ["hoisted (per sequence)" if s == "hoisted" else f"stage {s}" for s in stages]
    fig = go.Figure()
    for kind, items in (("GEMM", plan.get("gemms", [])), ("fused kernel", plan.get("kernels", []))):
        counts = [sum(1 for i in items if i["stage"] == s) for s in stages]
        names = ["<br>".join(i["name"] for i in items if i["stage"] == s) for s in stages]
        fig.add_trace(go.Bar(name=kind, x=labels, y=counts, customdata=names,
                             hovertemplate="%{x}: %{y} " + kind + "(s)<br>%{customdata}<extra></extra>"))
    fig.update_layout(barmode="stack", yaxis=dict(title="launches (one layer)", dtick=1), xaxis=dict(title="stage"),
                      legend=LEGEND_ON_TOP, height=280,
                      margin=dict(l=40, r=20, t=40, b=40))
    titled(fig, "Launches of one layer-step, by stage (hoisted work runs once per sequence)")
    return fig


# ---- GPU schedules (explain_json()["schedules"], engine/schedules/report.py) --------------------

SCHEDULE_NAMES = ("fused", "graph", "persistent")
BLOCK_COLOURS = ("#4c78a8", "#72b7b2", "#f58518", "#e45756", "#54a24b", "#b279a2")


def block_tiling_figure(tiling: Mapping, *, schedule: str = "") -> go.Figure:
    """Which block owns which hidden units of which layer: one horizontal bar per thread block.

    tiling: a wavefront schedule's "tiling" from explain_json (blocks_owned = [[layer, first unit,
    units], ...] in block order). Neighbouring blocks alternate colours so their edges show.
    """
    owned = tiling["blocks_owned"]
    resident = ", ".join(tiling.get("resident") or []) or "none"
    memory = f"{tiling['smem_bytes'] / 1024:.1f} KiB shared memory per block; weights resident: {resident}"
    fig = go.Figure(go.Bar(
        orientation="h", y=[f"layer {layer}" for layer, _, _ in owned], x=[units for _, _, units in owned],
        base=[first for _, first, _ in owned],
        marker=dict(color=[BLOCK_COLOURS[b % len(BLOCK_COLOURS)] for b in range(len(owned))],
                    line=dict(width=1, color="white")),
        customdata=[[b, layer, first, first + units - 1, units] for b, (layer, first, units) in enumerate(owned)],
        hovertemplate=("block %{customdata[0]}: layer %{customdata[1]}, hidden units %{customdata[2]} to "
                       "%{customdata[3]} (%{customdata[4]} units, every gate of them)<br>" + memory
                       + "<extra></extra>"),
        name="thread block", showlegend=False))
    title = (f"{schedule + ': ' if schedule else ''}{tiling['blocks']} blocks = {tiling['blocks_per_layer']} per "
             f"layer x {tiling['num_layers']} layer(s), {tiling['units_per_block']} hidden units each")
    fig.update_layout(title=title, barmode="overlay", bargap=0.15,
                      xaxis=dict(title="hidden unit (a block owns these columns of every gate)"),
                      yaxis=dict(title="layer", autorange="reversed", type="category"),
                      height=max(220, 40 * tiling["num_layers"] + 140), margin=dict(l=40, r=20, t=50, b=40))
    return fig


def schedule_comparison_table(report: Mapping) -> list[dict]:
    """One row per schedule: how the host launches it, kernel launches and barriers, whether it can run."""
    rows = []
    for name in SCHEDULE_NAMES:
        entry = report[name]
        if not entry["eligible"]:
            rows.append({"schedule": name, "can run": "no", "host launches per sequence": None, "launched as": "",
                         "kernel launches per step": None, "kernel launches per sequence": None,
                         "barriers per sequence": None, "synchronisation": entry["why_not"]})
            continue
        rows.append({"schedule": name, "can run": "yes",
                     "host launches per sequence": entry["host_launches_per_sequence"],
                     "launched as": entry["host_launch"], "kernel launches per step": entry["launches_per_step"],
                     "kernel launches per sequence": entry["kernel_launches_per_sequence"],
                     "barriers per sequence": entry["barriers_per_sequence"], "synchronisation": entry["sync"]})
    return rows


def shared_memory_table(tiling: Mapping) -> list[dict]:
    """One row per GEMM a block computes: its weight slice, and whether it is resident or streamed."""
    return [{"GEMM": g["name"], "role": g["role"], "weights": g["where"], "columns per block": g["columns_per_block"],
             "K": g["k"], "KiB per block": round(g["weight_kib_per_block"], 1)} for g in tiling["gemms"]]


# ---- benchmark results (engine/bench/results.py schema) ----------------------------------------

RESULT_COLUMNS = ("preset", "config", "I", "H", "L", "T", "B", "implementation", "family", "precision", "status",
                  "median_ms", "min_ms", "max_ms", "tflops", "vs_floor", "speedup_vs_cudnn_fp32",
                  "speedup_vs_cudnn_same_mode", "speedup_vs_naive", "max_abs_error", "reason")


def cell_label(cell: Mapping) -> str:
    """'lstm · mid': one benchmarked (cell, configuration) pair."""
    return f"{cell.get('preset')} · {cell.get('config', {}).get('name')}"


def results_table(results: Mapping) -> list[dict]:
    """One flat row per (cell, configuration, implementation), for st.dataframe and CSV."""
    rows = []
    for cell in results.get("cells", []):
        config = cell.get("config", {})
        base = {"preset": cell.get("preset"), "config": config.get("name"), "I": config.get("input_size"),
                "H": config.get("hidden_size"), "L": config.get("num_layers"), "T": config.get("steps"),
                "B": config.get("batch")}
        entries = cell.get("implementations") or []
        if not entries:
            rows.append({**dict.fromkeys(RESULT_COLUMNS), **base, "status": cell.get("status"),
                         "reason": cell.get("reason")})
        for entry in entries:
            speedup = entry.get("speedup") or {}
            rows.append({**base, "implementation": entry.get("name"), "family": entry.get("family"),
                         "precision": entry.get("precision"), "status": entry.get("status"),
                         "median_ms": entry.get("median_ms"), "min_ms": entry.get("min_ms"),
                         "max_ms": entry.get("max_ms"), "tflops": entry.get("tflops"),
                         "vs_floor": entry.get("vs_floor"), "speedup_vs_cudnn_fp32": speedup.get("vs_cudnn_fp32"),
                         "speedup_vs_cudnn_same_mode": speedup.get("vs_cudnn_same"),
                         "speedup_vs_naive": speedup.get("vs_naive"),
                         "max_abs_error": (entry.get("error") or {}).get("max_abs"), "reason": entry.get("reason")})
    return rows


NET_COLUMNS = ("preset", "net", "blocks", "I", "H", "T", "B", "implementation", "status", "median_ms", "min_ms",
               "max_ms", "tflops", "speedup_vs_cudnn_fp32", "relative_error", "reason")


def net_results_table(results: Mapping) -> list[dict]:
    """One flat row per (cell, network configuration, implementation) of a harness run with `--config deepspeech`
    and the like (engine/bench/nets.py)."""
    rows = []
    for net in results.get("nets") or []:
        config = net.get("config", {})
        base = {"preset": net.get("preset"), "net": config.get("name"), "blocks": blocks_label(net.get("net") or {}),
                "I": config.get("input_size"), "H": config.get("hidden_size"), "T": config.get("steps"),
                "B": config.get("batch")}
        for entry in net.get("implementations") or []:
            rows.append({**base, "implementation": entry.get("name"), "status": entry.get("status"),
                         "median_ms": entry.get("median_ms"), "min_ms": entry.get("min_ms"),
                         "max_ms": entry.get("max_ms"), "tflops": entry.get("tflops"),
                         "speedup_vs_cudnn_fp32": (entry.get("speedup") or {}).get("vs_cudnn_fp32"),
                         "relative_error": (entry.get("error") or {}).get("rel"), "reason": entry.get("reason")})
    return rows


def results_csv(rows: Sequence[Mapping]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(RESULT_COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in RESULT_COLUMNS})
    return buffer.getvalue()


def implementations_in(results: Mapping, status: str | None = "ok") -> list[str]:
    """Implementation names in first-seen order (only those that ran, by default)."""
    names: dict[str, None] = {}
    for cell in results.get("cells", []):
        for entry in cell.get("implementations") or []:
            if status is None or entry.get("status") == status:
                names.setdefault(entry["name"], None)
    return list(names)


def speedup_rows(results: Mapping, implementation: str, baselines: Sequence[str]) -> list[dict]:
    """Speedup of `implementation` over each baseline per (cell, configuration): the ratio of the two
    median times of the same run. Pairs where either did not run are left out."""
    rows = []
    for cell in results.get("cells", []):
        medians = {e["name"]: e.get("median_ms") for e in cell.get("implementations") or []
                   if e.get("status") == "ok" and e.get("median_ms")}
        if implementation not in medians:
            continue
        for baseline in baselines:
            if baseline in medians and baseline != implementation:
                rows.append({"config": cell_label(cell), "baseline": baseline,
                             "speedup": medians[baseline] / medians[implementation]})
    return rows


def engine_time_bars(results: Mapping) -> go.Figure:
    """The engine's backends and schedules side by side: median time per (cell, configuration), one bar
    per engine implementation that ran (naive, fused, graph, persistent, auto, ...)."""
    names = [n for n in implementations_in(results) if any(
        e.get("name") == n and e.get("family") == "engine" for c in results.get("cells", [])
        for e in c.get("implementations") or [])]
    configs = [cell_label(c) for c in results.get("cells", [])]
    fig = go.Figure()
    for name in names:
        medians, notes = [], []
        for cell in results.get("cells", []):
            entry = next((e for e in cell.get("implementations") or [] if e.get("name") == name), None)
            ok = entry is not None and entry.get("status") == "ok"
            medians.append(entry.get("median_ms") if ok else None)
            picked = ((entry or {}).get("detail") or {}).get("schedule")
            notes.append(f"autotuned: {picked}" if picked else "")
        fig.add_trace(go.Bar(name=name, x=configs, y=medians, customdata=notes,
                             hovertemplate="%{x}: %{y:.3f} ms %{customdata}<extra>" + name + "</extra>"))
    fig.update_layout(barmode="group", title="Engine backends and schedules: median time per run",
                      xaxis=dict(title="cell · configuration"), yaxis=dict(title="median time (ms, lower is better)"),
                      legend=LEGEND_ON_TOP, margin=dict(l=40, r=20, t=60, b=40))
    return fig


def divergence_series(results: Mapping, cell_index: int, against: str = "vs_reference",
                      stat: str = "max") -> list[dict]:
    """Per-step error curves of every implementation of one benchmarked cell, against the float64
    reference ("vs_reference") or cuDNN fp32 ("vs_cudnn_fp32"), as divergence_figure() series."""
    cell = results["cells"][cell_index]
    series = []
    for entry in cell.get("implementations") or []:
        curves = (entry.get("divergence") or {}).get(against) or {}
        if curves.get(stat):
            series.append({"label": f"{entry['name']} ({entry.get('precision', '?')})", "errors": curves[stat]})
    return series


# ---- training (the Train page; results are TrainResult.to_dict() dicts) --------------------------------

def smoothed(values: Sequence[float], window: int) -> list[float]:
    """The running mean over the last `window` values (fewer at the start): per-step training losses are noisy
    (a fresh batch each step), and the trend is what tells cells apart."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def training_loss_figure(results: Sequence[Mapping]) -> go.Figure:
    """Training loss per step of each cell (faint) and its running mean (solid), on a log axis."""
    fig = go.Figure()
    window = max(1, max((len(r["losses"]) for r in results), default=1) // 20)
    for i, r in enumerate(results):
        colour = PALETTE[i % len(PALETTE)]
        steps = list(range(1, len(r["losses"]) + 1))
        fig.add_trace(go.Scatter(x=steps, y=r["losses"], mode="lines", name=f"{r['cell']} (per step)",
                                 line=dict(color=colour, width=1), opacity=0.3, showlegend=False,
                                 hovertemplate="step %{x}: %{y:.4g}<extra>" + r["cell"] + "</extra>"))
        fig.add_trace(go.Scatter(x=steps, y=smoothed(r["losses"], window), mode="lines", name=r["cell"],
                                 line=dict(color=colour, width=2),
                                 hovertemplate=f"step %{{x}}: %{{y:.4g}} (mean of {window})<extra>{r['cell']}</extra>"))
    fig.update_layout(xaxis=dict(title="training step"), yaxis=dict(title="training loss", type="log"),
                      legend=LEGEND_ON_TOP, margin=dict(l=40, r=20, t=40, b=40))
    task = results[0]["task"] if results else ""
    titled(fig, f"Training loss on '{task}' (running mean of {window} steps over each step's loss)")
    return fig


def training_metric_figure(results: Sequence[Mapping]) -> go.Figure:
    """The held-out metric of each cell against the training step, with the task's input-blind baseline."""
    fig = go.Figure()
    for i, r in enumerate(results):
        fig.add_trace(go.Scatter(x=r["eval_steps"], y=r["eval_metrics"], mode="lines+markers", name=r["cell"],
                                 line=dict(color=PALETTE[i % len(PALETTE)]),
                                 hovertemplate="step %{x}: %{y:.4g}<extra>" + r["cell"] + "</extra>"))
    if results:
        metric = results[0]["metric"]
        fig.add_hline(y=results[0]["baseline"], line_dash="dash", line_color="black",
                      annotation_text="without the input", annotation_position="top right")
        better = "higher" if metric == "accuracy" else "lower"
        fig.update_layout(yaxis=dict(title=f"held-out {metric} ({better} is better)"))
    fig.update_layout(xaxis=dict(title="training step"), legend=LEGEND_ON_TOP, margin=dict(l=40, r=20, t=40, b=40))
    titled(fig, "Held-out score during training")
    return fig


def training_table(results: Sequence[Mapping]) -> list[dict]:
    """One row per cell: its final held-out loss and metric, its test metric where the task has a test split, the
    baseline, its size and time."""
    rows = []
    for r in results:
        row = {"cell": r["cell"], f"final {r['metric']}": r["final_metric"], "final loss": r["final_loss"]}
        if r.get("test_metric") is not None:
            row[f"test {r['metric']}"] = r["test_metric"]
        rows.append(row | {"without the input": r["baseline"], "parameters": r["num_params"],
                           "seconds": round(r["seconds"], 2)})
    return rows
