"""The sizes of a cell's values: every value is I (input), H (hidden) or P (projection) wide, or a scalar, and
infer_dims works them out over a graph in topological order, reporting each mismatch once (engine/ir.py's
validation and engine/network.py's size checks use it).
"""
from __future__ import annotations

from typing import Iterable

from .errors import Problem
from .ops import OPS

DIMS = ("I", "H", "P")
STATE_DIMS = ("H", "P")   # the sizes a state may have
SCALAR = "1"  # the dim of a const: broadcasts against any vector
UNKNOWN = "?"  # the dim of a value downstream of a reported mismatch (not reported again)


def infer_dims(by_name: dict, order: Iterable[str],
                input_is_hidden: bool = False) -> tuple[dict[str, str], list[Problem]]:
    """The size (I, H or scalar) of every value of `by_name` (name -> engine.ir.Node), and the size mismatches. With input_is_hidden the cell runs
    only where input size == hidden size (engine.network checks it), so I is H: x may meet H-sized values."""
    def size(d):
        return "H" if input_is_hidden and d == "I" else d

    dims: dict[str, str] = {}
    problems: list[Problem] = []
    weight_users: dict[str, tuple[str, str]] = {}
    for name in order:
        n = by_name[name]
        if n.op == "input":
            dims[name] = size("I")
        elif n.op == "state":
            dims[name] = n.attr("dim", "H")
        elif n.op == "weight":
            dims[name] = size(n.attr("rows"))
        elif n.op in ("bias", "vector"):
            dims[name] = size(n.attr("dim", "H"))
        elif n.op == "const":
            dims[name] = SCALAR
        elif OPS[n.op].kind == "reduction":
            (operand,) = n.args
            if dims[operand] not in ("H", UNKNOWN):
                problems.append(Problem(f"'{n.op}' reduces over the H hidden units, but '{operand}' has size "
                                        f"{dims[operand]}", node=name, field="args.x",
                                        hint="reduce an H-sized value (a gate, a state, a W @ h); project an input "
                                             "or P-sized value to H first with a weight"))
            dims[name] = "H" if dims[operand] != UNKNOWN else UNKNOWN
        elif n.op == "matmul":
            w, operand = (by_name[a] for a in n.args)
            od = dims[operand.name]
            if od == UNKNOWN:
                pass
            elif od == SCALAR:
                problems.append(Problem(f"matmul operand '{operand.name}' is a scalar", node=name,
                                        field="args.operand",
                                        hint="a weight multiplies a vector of size I or H, not a constant"))
            elif od != size(w.attr("cols")):
                prior = weight_users.get(w.name)
                why = (f"; it is also applied to '{prior[0]}' of size {prior[1]}" if prior else "")
                problems.append(Problem(
                    f"weight '{w.name}' has {w.attr('cols')} columns but operand '{operand.name}' has size {od}{why}",
                    node=name, field="args.operand",
                    hint=f"set the weight's cols to {od}, or use a separate weight per operand"))
            weight_users.setdefault(w.name, (operand.name, od))
            dims[name] = size(w.attr("rows"))
        else:
            arg_dims = {dims[a] for a in n.args} - {SCALAR}
            if UNKNOWN in arg_dims:
                dims[name] = UNKNOWN
            elif len(arg_dims) > 1:
                detail = ", ".join(f"'{a}' is {dims[a]}" for a in n.args)
                problems.append(Problem(f"shape mismatch in '{n.op}': {detail}", node=name, field="args",
                                        hint="elementwise ops need operands of the same size (I or H); a cell "
                                             "that adds x to hidden-sized values declares input_is_hidden"))
                dims[name] = UNKNOWN
            else:
                dims[name] = arg_dims.pop() if arg_dims else SCALAR
    return dims, problems
