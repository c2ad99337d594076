"""The closed op set: one table that every layer reads (validation, reference, codegen, LaTeX, DSL).

Each op is defined once here. Its NumPy definition is the meaning of the op; the CUDA expression
and the LaTeX form must agree with it (the tests check codegen against the reference). Each entry
also carries its gradient rule (`vjp`: one vector-Jacobian product per port), written over the op's
saved forward values, and GRAD_OPS defines the few ops that only the backward step uses
(engine/autodiff derives a cell's backward step from these rules).
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


def _sigmoid_grad(dy, y):
    # sigmoid'(x) = y (1 - y): from the saved output, so the backward never recomputes an exponential.
    return dy * (y * (1.0 - y))


def _tanh_grad(dy, y):
    return dy * (1.0 - y * y)


def _relu_grad(dy, y):
    # PyTorch's convention (threshold_backward on the result): relu'(0) = 0, the adjoint passes where y > 0.
    return np.where(y > 0, dy, np.zeros_like(dy))


def _hard_sigmoid_grad(dy, x):
    # PyTorch's hardsigmoid_backward: 1/6 strictly inside (-3, 3), 0 at both kinks and outside. It reads the
    # input x, not the output: y = 0 or 1 can be a rounded x just inside the interval.
    return np.where((x > -3.0) & (x < 3.0), dy * (1.0 / 6.0), np.zeros_like(dy))


def _outer(dy, operand):
    # The operand may be one vector for the whole batch (a value computed from parameters alone).
    if operand.ndim == 2 and operand.shape[0] == dy.shape[0]:
        return dy.T @ operand                                                     # (rows, B) @ (B, cols)
    return dy.T @ np.broadcast_to(operand, (dy.shape[0], operand.shape[-1]))


def _batch_sum(dy):
    """dy summed over its rows. On the GPU a (rows, n) array with many rows is summed as ones(rows) @ dy, a cuBLAS
    GEMV: CuPy's reduction over the first axis took 160 us for 6400 x 512 floats, the GEMV a few."""
    if type(dy).__module__.split(".")[0] == "cupy" and dy.ndim == 2 and dy.shape[0] >= 64:
        import cupy
        return (cupy.ones((1, dy.shape[0]), dtype=dy.dtype) @ dy)[0]
    return dy.sum(axis=0)


def _sum(*terms):
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


@dataclass(frozen=True)
class Vjp:
    """One port's vector-Jacobian product: the backward op `op` applied to `args`, names in the op's frame:
    "dy" is the adjoint of the op's value, "y" the value itself, a port name ("a", "x", "weight") that
    argument's value. A backward op that takes attributes (scale's factor) reads the forward node's.

    `role` says where the result goes: "adjoint" (a term of the argument's adjoint at this step),
    "operand_grad" (the same, through a transposed weight) or "weight_grad" (the weight's gradient,
    accumulated over the batch and every time step)."""

    op: str
    args: tuple[str, ...]
    role: str = "adjoint"

    @property
    def passes_through(self) -> bool:
        """The adjoint reaches the argument unchanged (add, identity): no backward node is needed."""
        return self.op == "identity" and self.args == ("dy",)


PASS = Vjp("identity", ("dy",))
NEGATE = Vjp("neg", ("dy",))


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
    vjp: tuple[Vjp, ...] = ()          # the gradient rule: one vector-Jacobian product per port, in port order

    @property
    def arity(self) -> int:
        return len(self.ports)


OPS: dict[str, OpDef] = {op.name: op for op in [
    OpDef("matmul", ("weight", "operand"), "matmul", None, None, r"{weight}\,{operand}",
          description="weight (rows x cols) times a vector of size cols", category="linear",
          vjp=(Vjp("outer", ("dy", "operand"), "weight_grad"), Vjp("matmul_t", ("weight", "dy"), "operand_grad"))),
    OpDef("add", ("a", "b"), "elementwise", np.add, "({a} + {b})", r"{a} + {b}",
          description="a + b", category="arithmetic", vjp=(PASS, PASS)),
    OpDef("sub", ("a", "b"), "elementwise", np.subtract, "({a} - {b})", r"{a} - {b}",
          description="a - b", category="arithmetic", vjp=(PASS, NEGATE)),
    OpDef("mul", ("a", "b"), "elementwise", np.multiply, "({a} * {b})", r"{a} \odot {b}",
          description="elementwise product", category="arithmetic",
          vjp=(Vjp("mul", ("dy", "b")), Vjp("mul", ("dy", "a")))),
    OpDef("neg", ("x",), "elementwise", np.negative, "(-{x})", r"-{x}",
          description="-x", category="arithmetic", vjp=(NEGATE,)),
    OpDef("one_minus", ("x",), "elementwise", lambda x: 1.0 - x, "(1.0f - {x})", r"1 - {x}",
          description="1 - x (coupled gates)", category="arithmetic", vjp=(NEGATE,)),
    OpDef("scale", ("x",), "elementwise", None, "({factor} * {x})", r"{factor}\,{x}",
          attrs=("factor",), description="factor * x for a fixed number factor", category="arithmetic",
          vjp=(Vjp("scale", ("dy",)),)),
    OpDef("sigmoid", ("x",), "elementwise", _sigmoid, "sigmoidf_({x})", r"\sigma({x})",
          description="logistic sigmoid", category="activation", vjp=(Vjp("sigmoid_grad", ("dy", "y")),)),
    OpDef("tanh", ("x",), "elementwise", np.tanh, "tanhf({x})", r"\tanh({x})",
          description="hyperbolic tangent", category="activation", vjp=(Vjp("tanh_grad", ("dy", "y")),)),
    OpDef("relu", ("x",), "elementwise", lambda x: np.maximum(x, 0.0), "fmaxf({x}, 0.0f)",
          r"\mathrm{{relu}}({x})", description="max(x, 0)", category="activation",
          vjp=(Vjp("relu_grad", ("dy", "y")),)),
    OpDef("hard_sigmoid", ("x",), "elementwise", _hard_sigmoid, "hard_sigmoidf_({x})",
          r"\mathrm{{hardsigmoid}}({x})", description="clip(x/6 + 1/2, 0, 1), as PyTorch's Hardsigmoid",
          category="activation", vjp=(Vjp("hard_sigmoid_grad", ("dy", "x")),)),
    OpDef("identity", ("x",), "elementwise", lambda x: x, "{x}", r"{x}",
          description="x unchanged (names a value, or drops an activation)", category="activation", vjp=(PASS,)),
]}


# The ops only a backward step uses. Its other ops are forward ones (mul, neg, scale). The CUDA forms are what the
# fused training step (engine/autodiff/fused_codegen.py) writes; tests/gpu/test_fused_training_gpu.py holds them to
# the NumPy meanings.
GRAD_OPS: dict[str, OpDef] = {op.name: op for op in [
    OpDef("sigmoid_grad", ("dy", "y"), "elementwise", _sigmoid_grad, "({dy} * ({y} * (1.0f - {y})))", r"{dy} \odot {y} \odot (1 - {y})",
          description="dy * sigmoid'(x), from the output y", category="gradient"),
    OpDef("tanh_grad", ("dy", "y"), "elementwise", _tanh_grad, "({dy} * (1.0f - {y} * {y}))", r"{dy} \odot (1 - {y}^2)",
          description="dy * tanh'(x), from the output y", category="gradient"),
    OpDef("relu_grad", ("dy", "y"), "elementwise", _relu_grad, "(({y} > 0.0f) ? {dy} : 0.0f)", r"{dy} \odot [{y} > 0]",
          description="dy where y > 0, else 0 (relu'(0) = 0, as PyTorch)", category="gradient"),
    OpDef("hard_sigmoid_grad", ("dy", "x"), "elementwise", _hard_sigmoid_grad,
          "((({x} > -3.0f) && ({x} < 3.0f)) ? {dy} * (1.0f / 6.0f) : 0.0f)",
          r"\tfrac{{1}}{{6}} {dy} \odot [-3 < {x} < 3]",
          description="dy / 6 strictly inside (-3, 3), else 0 (as PyTorch)", category="gradient"),
    OpDef("sum", ("terms",), "sum", _sum, None, r"\sum {terms}",
          description="the adjoint of a value read several times: the sum of its consumers' terms",
          category="gradient"),
    OpDef("matmul_t", ("weight", "dy"), "matmul", lambda weight, dy: dy @ weight, None, r"{weight}^\top {dy}",
          description="the operand's adjoint term W^T dy: (B, rows) @ (rows, cols)", category="gradient"),
    OpDef("outer", ("dy", "operand"), "matmul", _outer, None, r"{dy}^\top {operand}",
          description="a weight's gradient dy^T operand, summed over the batch (rows x cols)",
          category="gradient"),
    OpDef("batch_sum", ("dy",), "reduction", _batch_sum, None, r"\textstyle\sum_b {dy}",
          description="a bias's or vector's gradient: its adjoint summed over the batch", category="gradient"),
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


def apply_backward(op: str, args: list, attrs: dict):
    """The reference meaning of a backward op: one of GRAD_OPS, or a forward elementwise op (mul, neg, scale)."""
    if op in GRAD_OPS:
        return GRAD_OPS[op].numpy(*args)
    return apply_elementwise(op, args, attrs)


def backward_op_def(name: str) -> OpDef | None:
    """The definition of an op a gradient rule names (GRAD_OPS first, then the forward table), or None."""
    return GRAD_OPS.get(name) or OPS.get(name)
