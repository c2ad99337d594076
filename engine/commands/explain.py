"""`python -m engine explain <preset or cell.json>`: what the compiler does to a cell.

Prints the graph after each pass, the GEMM groups with their packed weight layouts and shapes, the
generated kernels and their CUDA source, the cost per step and the wavefront; --json prints the
same as engine.explain_json (what the app displays).
"""
from __future__ import annotations

import json

from ..explain import explain_json, explain_text
from ..gallery import presets
from ..passes import PASS_NAMES
from ..plan import LAYOUTS
from ._common import add_size_args, resolve_cell


def add_parser(sub) -> None:
    p = sub.add_parser("explain", help="show the passes, GEMM groups, generated kernels and wavefront of a cell")
    p.add_argument("cell", help="preset name or path to a cell JSON file")
    p.add_argument("--json", action="store_true", help="print JSON (engine.explain_json) instead of text")
    add_size_args(p, steps=True, batch=True)
    add_pass_args(p)
    p.add_argument("--no-source", action="store_true", help="leave out the CUDA source (text output)")
    p.set_defaults(func=main)


def add_pass_args(p) -> None:
    p.add_argument("--off", nargs="+", default=[], metavar="PASS", choices=PASS_NAMES,
                   help="switch passes off: " + ", ".join(PASS_NAMES))
    p.add_argument("--layout", choices=LAYOUTS, default="blocked", help="packed weight layout (default blocked)")
    p.add_argument("--chunk-steps", type=int, default=None,
                   help="steps per input projection of layers > 0 in the wavefront (default: engine's choice)")


def resolve_target(spec: str):
    """A Preset (its documentation goes into the generated source) or a CellGraph from a JSON file."""
    return presets()[spec] if spec in presets() else resolve_cell(spec)


def main(args) -> int:
    target = resolve_target(args.cell)
    kwargs = dict(input_size=args.input_size, hidden_size=args.hidden_size, num_layers=args.layers,
                  steps=args.steps, batch=args.batch, passes={name: False for name in args.off},
                  layout=args.layout, chunk_steps=args.chunk_steps)
    if args.json:
        print(json.dumps(explain_json(target, **kwargs), indent=1))
    else:
        print(explain_text(target, sources=not args.no_source, **kwargs))
    return 0
