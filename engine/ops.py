"""The closed op set: one table that every layer reads (validation, reference, codegen, LaTeX, DSL).

Each op is defined once here. Its NumPy definition is the meaning of the op; the CUDA expression
and the LaTeX form must agree with it (the tests check codegen against the reference). A gradient
rule will later be attached to the same entry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# Leaf kinds: nodes with no arguments. They are not ops but share the node namespace.
LEAF_KINDS = ("input", "state", "weight", "bias", "vector", "const")
# Leaves that are trainable parameters of a layer (consts are fixed numbers in the graph).
PARAM_KINDS = ("weight", "bias", "vector")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _hard_sigmoid(x):
    # PyTorch's Hardsigmoid: relu6(x + 3) / 6.
    return np.clip(x / 6.0 + 0.5, 0.0, 1.0)


@dataclass(frozen=True)
class OpDef:
    name: str
    ports: tuple[str, ...]             # named inputs, in argument order
    kind: str                          # "elementwise" or "matmul"
    numpy: Callable | None             # reference meaning (None for matmul: done by the executor)
    cuda: str | None                   # CUDA expression over {a}, {b}, {x}, {factor}
    latex: str                         # LaTeX template over the same names
    attrs: tuple[str, ...] = ()        # required attributes
    description: str = ""
    category: str = "ops"
    extra: dict = field(default_factory=dict)

    @property
    def arity(self) -> int:
        return len(self.ports)


OPS: dict[str, OpDef] = {op.name: op for op in [
    OpDef("matmul", ("weight", "operand"), "matmul", None, None, r"{weight}\,{operand}",
          description="weight (rows x cols) times a vector of size cols", category="linear"),
    OpDef("add", ("a", "b"), "elementwise", np.add, "({a} + {b})", r"{a} + {b}",
          description="a + b", category="arithmetic"),
    OpDef("sub", ("a", "b"), "elementwise", np.subtract, "({a} - {b})", r"{a} - {b}",
          description="a - b", category="arithmetic"),
    OpDef("mul", ("a", "b"), "elementwise", np.multiply, "({a} * {b})", r"{a} \odot {b}",
          description="elementwise product", category="arithmetic"),
    OpDef("neg", ("x",), "elementwise", np.negative, "(-{x})", r"-{x}",
          description="-x", category="arithmetic"),
    OpDef("one_minus", ("x",), "elementwise", lambda x: 1.0 - x, "(1.0f - {x})", r"1 - {x}",
          description="1 - x (coupled gates)", category="arithmetic"),
    OpDef("scale", ("x",), "elementwise", None, "({factor} * {x})", r"{factor}\,{x}",
          attrs=("factor",), description="factor * x for a fixed number factor", category="arithmetic"),
    OpDef("sigmoid", ("x",), "elementwise", _sigmoid, "sigmoidf_({x})", r"\sigma({x})",
          description="logistic sigmoid", category="activation"),
    OpDef("tanh", ("x",), "elementwise", np.tanh, "tanhf({x})", r"\tanh({x})",
          description="hyperbolic tangent", category="activation"),
    OpDef("relu", ("x",), "elementwise", lambda x: np.maximum(x, 0.0), "fmaxf({x}, 0.0f)",
          r"\mathrm{{relu}}({x})", description="max(x, 0)", category="activation"),
    OpDef("hard_sigmoid", ("x",), "elementwise", _hard_sigmoid, "hard_sigmoidf_({x})",
          r"\mathrm{{hardsigmoid}}({x})", description="clip(x/6 + 1/2, 0, 1), as PyTorch's Hardsigmoid",
          category="activation"),
    OpDef("identity", ("x",), "elementwise", lambda x: x, "{x}", r"{x}",
          description="x unchanged (names a value, or drops an activation)", category="activation"),
]}


# How tightly the infix renderings of ops bind, for the equations in LaTeX (engine/latex.py) and in plain text
# (engine/codegen/equations.py): one table and one rule, so the two agree. A matmul is written W x (tightest).
PRECEDENCE = {"add": 1, "sub": 1, "one_minus": 1, "mul": 2, "scale": 2, "neg": 2, "matmul": 3}


def needs_parens(child: str, parent: str, right: bool = False) -> bool:
    """Whether an inlined `child` expression must be parenthesised as an operand of `parent`: it binds less
    tightly, or it is the right operand of a subtraction at the same level (a - (b - c), 1 - (a + b);
    `one_minus` subtracts its operand). Function-style ops (sigmoid(...)) never need them."""
    if child not in PRECEDENCE or parent not in PRECEDENCE:
        return False
    mine, theirs = PRECEDENCE[child], PRECEDENCE[parent]
    subtracted = parent == "one_minus" or (right and parent == "sub")
    return mine < theirs or (subtracted and mine == theirs)


def op_def(name: str) -> OpDef:
    return OPS[name]


def apply_elementwise(op: str, args: list, attrs: dict):
    """The reference meaning of an elementwise op on NumPy arrays."""
    if op == "scale":
        return attrs["factor"] * args[0]
    return OPS[op].numpy(*args)
