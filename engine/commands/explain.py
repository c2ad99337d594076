"""`python -m engine explain <preset or cell.json>`: what the compiler does to a cell.

Prints the graph after each pass, the GEMM groups with their packed weight layouts and shapes, the
generated kernels and their CUDA source, the cost per step and the wavefront; --json prints the
same as engine.explain_json (what the app displays). --schedule adds what that GPU schedule does
(tiling, launches, barriers, shared memory, the autotuner's cached choice) and, for graph and
persistent, ends with their generated CUDA; --source-only prints nothing but that CUDA.

    python -m engine explain lstm -L 2 --schedule persistent
    python -m engine explain gru --schedule graph --source-only > gru_graph.cu
"""
from __future__ import annotations

import json

from ..errors import CompileError
from ..explain import explain_json, explain_text
from ..gallery import Preset, presets
from ..network import Network
from ..passes import PASS_NAMES
from ..plan import LAYOUTS
from ..schedules.report import SCHEDULE_CHOICES
from ._common import add_size_args, resolve_cell, steps_flag


def add_parser(sub) -> None:
    p = sub.add_parser("explain", help="show the passes, GEMM groups, generated kernels and wavefront of a cell")
    p.add_argument("cell", help="preset name or path to a cell JSON file")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON (engine.explain_json) instead of text")
    output.add_argument("--source-only", action="store_true",
                        help="print only the generated CUDA: of the --schedule (graph, persistent, or what auto "
                             "picks), else of the fused backend")
    add_size_args(p, steps=True, batch=True)
    add_pass_args(p)
    p.add_argument("--schedule", choices=SCHEDULE_CHOICES, default=None,
                   help="also explain this GPU schedule: tiling, launches, barriers, shared memory, the "
                        "autotuner's choice; graph and persistent end with their generated CUDA")
    p.add_argument("--precision", default="float32", choices=["float32", "tf32", "float16", "bfloat16", "float32x3"],
                   help="the mode the GPU schedules are planned in (tensor-core tiles for tf32/float16/bfloat16)")
    p.add_argument("--no-source", action="store_true", help="leave out the CUDA source (text output)")
    p.set_defaults(func=main)


def add_pass_args(p) -> None:
    p.add_argument("--off", nargs="+", default=[], metavar="PASS", choices=PASS_NAMES,
                   help="switch passes off: " + ", ".join(PASS_NAMES))
    p.add_argument("--layout", choices=LAYOUTS, default="blocked", help="packed weight layout (default blocked)")
    p.add_argument("--chunk-steps", type=steps_flag, default=None,
                   help="steps per input projection of layers > 0 in the wavefront (default: engine's choice)")


def resolve_target(spec: str):
    """A Preset (its documentation goes into the generated source) or a CellGraph from a JSON file."""
    return presets()[spec] if spec in presets() else resolve_cell(spec)


def main(args) -> int:
    target = resolve_target(args.cell)
    if args.proj_size is not None:                 # a Network carries P into explain
        cell = target.cell if isinstance(target, Preset) else target
        target = Network(cell, args.input_size, args.hidden_size, args.layers, args.proj_size)
    kwargs = dict(input_size=args.input_size, hidden_size=args.hidden_size, num_layers=args.layers,
                  steps=args.steps, batch=args.batch, passes={name: False for name in args.off},
                  layout=args.layout, chunk_steps=args.chunk_steps, schedule=args.schedule, precision=args.precision)
    if args.source_only:
        if args.no_source:
            raise CompileError("--source-only prints nothing but the CUDA source; --no-source leaves it out. "
                               "hint: give one of them")
        print(cuda_source(explain_json(target, **kwargs)).rstrip("\n"))
    elif args.json:
        print(json.dumps(explain_json(target, **kwargs), indent=1))
    else:
        print(explain_text(target, sources=not args.no_source, **kwargs))
    return 0


def cuda_source(explained: dict) -> str:
    """The CUDA of the schedule explain_json selected: a wavefront schedule's own, or the fused backend's."""
    schedules = explained["schedules"]
    chosen = schedules["selected"]["schedule"]
    if chosen == "fused" or schedules["requested"] in (None, "fused"):
        return explained["source"]
    entry = schedules[chosen]
    if not entry["eligible"]:
        raise CompileError(f"cell '{explained['cell']}' cannot use schedule '{chosen}': {entry['why_not']}\n"
                           "  hint: --schedule fused prints the fused backend's kernels")
    return entry["source"]
