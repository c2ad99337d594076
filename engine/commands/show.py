"""`python -m engine show <preset or cell.json>`: equations, states, parameters, validation."""
from __future__ import annotations

from ..latex import equations
from ..network import Network
from ..serialize import to_json
from ._common import add_size_args, resolve_cell


def add_parser(sub) -> None:
    p = sub.add_parser("show", help="show a cell: equations, states, parameters with shapes, validation")
    p.add_argument("cell", help="preset name or path to a cell JSON file")
    p.add_argument("--json", action="store_true", help="print the cell graph JSON instead")
    add_size_args(p)
    p.set_defaults(func=main)


def main(args) -> int:
    cell = resolve_cell(args.cell)     # raises CellGraphError with the node/field on invalid input
    if args.json:
        print(to_json(cell))
        return 0
    net = Network(cell, args.input_size, args.hidden_size, args.layers, args.proj_size)
    print(f"cell {cell.name}  (structural hash {cell.structural_hash})")
    if cell.doc:
        print("\n" + cell.doc.strip() + "\n")
    print("equations (LaTeX):")
    for line in equations(cell):
        print("  " + line.replace("&=", "="))
    print("\nstates: " + ", ".join(f"{s.name} <- {s.next}" for s in cell.states) + f"   (output: {cell.output})")
    projection = f", P={net.projection_size}" if cell.uses_projection else ""
    print(f"\nparameters of layer 0 (I={args.input_size}, H={args.hidden_size}{projection}):")
    for p in cell.params:
        print(f"  {p.name:<12} {p.op:<7} {net.param_shape(0, p.name)}")
    print(f"total over {args.layers} layer(s): {net.num_params():,} parameters")
    print("\nvalidation: OK" + ("" if not cell.warnings else f" with {len(cell.warnings)} warning(s)"))
    for w in cell.warnings:
        print(f"  warning: {w}")
    return 0
