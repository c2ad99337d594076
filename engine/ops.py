"""The closed op set: one table that every layer reads (validation, reference, codegen, equations, DSL,
torch, the designer's palette, FLOP counts).

Each op is defined once here, as one `OpDef` in OPS. Its NumPy definition is the meaning of the op; the
CUDA expression, the LaTeX and plain-text forms and the torch spelling must agree with it (the tests check
codegen and torch against the reference). Each entry also carries its gradient rule (`vjp`: one
vector-Jacobian product per port), written over the op's saved forward values, with the backward-only ops
the rule names (`grad_ops`, gathered into GRAD_OPS; engine/autodiff derives a cell's backward step from
these rules).

Everything else is derived from the table, never listed again: the functions of engine.dsl (one per
elementwise op without attributes, named like the op), the activations (category "activation": the DSL
names their operand `<value>_pre`, the designer's gate and candidate offer them), the auto-names the
equations inline (engine/equations.py), the CUDA helper names the code generator keeps free
(`cuda_helpers`), the torch spelling of engine/bench/torch_cell.py, the palette's op blocks and the FLOP
counts (engine/flops.py).

How to add an op:
1. Add one OpDef to OPS below: name, ports, NumPy meaning, CUDA expression, LaTeX (and `text` where the
   plain-text form is not `name(x)`), torch spelling, category, description, and the gradient rule `vjp`
   with any backward-only op it needs in `grad_ops` (its NumPy meaning and CUDA form).
2. If its CUDA form calls a device helper (as sigmoid's `sigmoidf_`), write the helper in
   kernels/cell_ops.cuh (and its double overload in kernels/naive_ops.cuh) and name it in `cuda_helper`.
3. Tests: tests/test_ops_table.py shows what one entry reaches (DSL, palette, LaTeX, CUDA, the NumPy
   reference, the gradient check); the preset, fuzz and GPU tests run every op of the table.
A test can add an op for its duration with `register(op)` / `unregister(name)`.
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


def matmul_apply(weight, operand):
    """weight times each row of operand: (B, cols) -> (B, rows). A weight of heads (heads, rows/heads, cols/heads) is
    block-diagonal: head k's block multiplies columns k*cols/heads.. of the operand and gives the same rows' block."""
    if weight.ndim == 3:
        heads, rows, cols = weight.shape
        lead = operand.shape[:-1]
        blocks = operand.reshape(lead + (heads, cols))
        return array_module(operand).einsum("...hc,hrc->...hr", blocks, weight).reshape(lead + (heads * rows,))
    return operand @ weight.T                            # (B, cols) @ (cols, rows) -> (B, rows)


def array_module(array):
    """numpy, or cupy for a CuPy array: the module whose functions take `array` where it lives."""
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        return cupy
    return np


def _matmul_t(weight, dy):
    """The operand's adjoint term W^T dy, (B, rows) -> (B, cols); block by block for a weight of heads."""
    if weight.ndim == 3:
        heads, rows, cols = weight.shape
        return array_module(dy).einsum("bhr,hrc->bhc", dy.reshape(-1, heads, rows), weight).reshape(-1, heads * cols)
    return dy @ weight


def outer_heads(dy, operand, heads: int):
    """A weight's gradient dy^T operand summed over the batch; for a weight of `heads` blocks, only the blocks:
    (heads, rows/heads, cols/heads)."""
    if heads == 1:
        return _outer(dy, operand)
    if operand.ndim != 2 or operand.shape[0] != dy.shape[0]:
        operand = np.broadcast_to(operand, (dy.shape[0], operand.shape[-1]))
    b = dy.shape[0]
    return array_module(dy).einsum("bhr,bhc->hrc", dy.reshape(b, heads, -1), operand.reshape(b, heads, -1))


def _sum_h(x):
    """The sum over the hidden units of each row, broadcast back to every unit (the row's sum at each position)."""
    return x.sum(axis=-1, keepdims=True).repeat(x.shape[-1], axis=-1)


def _mean_h(x):
    return x.mean(axis=-1, keepdims=True).repeat(x.shape[-1], axis=-1)


def _batch_sum(dy):
    """dy summed over its rows. On the GPU a (rows, n) array with many rows is summed as ones(rows) @ dy, a cuBLAS
    GEMV: CuPy's reduction over the first axis took 160 us for 6400 x 512 floats, the GEMV a few."""
    if type(dy).__module__.split(".")[0] == "cupy" and dy.ndim == 2 and dy.shape[0] >= 64:
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        return (cupy.ones((1, dy.shape[0]), dtype=dy.dtype) @ dy)[0]
    return dy.sum(axis=0)


def _sum(*terms):
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


# ---- the functions of cells after 2017 (exponential gates, LayerNorm, min-RNNs): NumPy meanings -----------------
# Each is the float64 definition the kernels are checked against; where a naive formula overflows, the form here
# does not (softplus and log_sigmoid through logaddexp; x * sigmoid(x) is finite for every finite x).

GELU_C = 0.7978845608028654          # sqrt(2 / pi): GELU's tanh form (Hendrycks & Gimpel 2016, eq. 2)
GELU_K = 0.044715


def _softplus(x):
    return np.logaddexp(0.0, x)                          # log(1 + e^x), without overflow for large x


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)                        # log(sigmoid(x)) = -softplus(-x)


def _silu(x):
    return x * _sigmoid(x)


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + GELU_K * x * x * x)))


def _silu_grad(dy, x):
    s = _sigmoid(x)
    return dy * (s * (1.0 + x * (1.0 - s)))


def _gelu_grad(dy, x):
    t = np.tanh(GELU_C * (x + GELU_K * x * x * x))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_K * x * x))


def _max_grad(dy, a, b):
    # The adjoint of max(a, b) towards a: all of dy where a > b, half where a == b (the other half goes to b), as
    # PyTorch's torch.maximum backward. A tie splits evenly so that max(a, a) = a keeps its gradient dy.
    return np.where(a > b, dy, np.where(a == b, 0.5 * dy, np.zeros_like(dy)))


def _min_grad(dy, a, b):
    return _max_grad(dy, b, a)                           # a < b is b > a; a tie splits the same way


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
    category: str = "ops"              # the palette's group; "activation" makes it an activation
    extra: dict = field(default_factory=dict)
    vjp: tuple[Vjp, ...] = ()          # the gradient rule: one vector-Jacobian product per port, in port order
    grad_ops: tuple["OpDef", ...] = () # the backward-only ops `vjp` names (they join GRAD_OPS)
    text: str = ""                     # plain-text template (generated CUDA's header comment); "" = name(ports)
    torch: str | None = None           # torch spelling over the port names (engine/bench/torch_cell.py)
    cuda_helper: str | None = None     # the device helper of kernels/cell_ops.cuh that `cuda` calls, if any
    flops: int = 1                     # FLOPs per element produced (engine/flops.py)
    precedence: int | None = None      # how tightly its infix form binds in the equations (matmul's W x: 3)
    latex_groups: bool = False         # its LaTeX form groups its operands itself (\frac): no parentheses there
    domain: str = "real"               # where its NumPy meaning is finite: "real", "positive" (log, sqrt), or
                                       # "nonzero_b" (div): the tests draw operands from it

    @property
    def arity(self) -> int:
        return len(self.ports)

    @property
    def text_template(self) -> str:
        return self.text or f"{self.name}({', '.join('{' + port + '}' for port in self.ports)})"

    @property
    def is_activation(self) -> bool:
        return self.category == "activation"

    @property
    def dsl_function(self) -> str | None:
        """The engine.dsl function that builds this op, or None: a matmul is written `W(...) @ x` and an op with
        attributes through Python (scale: `0.5 * x`)."""
        return self.name if self.kind in ("elementwise", "reduction") and not self.attrs else None


OPS: dict[str, OpDef] = {op.name: op for op in [
    OpDef("matmul", ("weight", "operand"), "matmul", None, None, r"{weight}\,{operand}",
          description="weight (rows x cols) times a vector of size cols", category="linear",
          vjp=(Vjp("outer", ("dy", "operand"), "weight_grad"), Vjp("matmul_t", ("weight", "dy"), "operand_grad")),
          text="{weight} {operand}", torch="F.linear({operand}, {weight})", precedence=3),     # operand (B, cols) @ weight.T
    OpDef("add", ("a", "b"), "elementwise", np.add, "({a} + {b})", r"{a} + {b}",
          description="a + b", category="arithmetic", vjp=(PASS, PASS), text="{a} + {b}", torch="({a} + {b})",
          precedence=1),
    OpDef("sub", ("a", "b"), "elementwise", np.subtract, "({a} - {b})", r"{a} - {b}",
          description="a - b", category="arithmetic", vjp=(PASS, NEGATE), text="{a} - {b}", torch="({a} - {b})",
          precedence=1),
    OpDef("mul", ("a", "b"), "elementwise", np.multiply, "({a} * {b})", r"{a} \odot {b}",
          description="elementwise product", category="arithmetic",
          vjp=(Vjp("mul", ("dy", "b")), Vjp("mul", ("dy", "a"))), text="{a} * {b}", torch="({a} * {b})",
          precedence=2),
    OpDef("neg", ("x",), "elementwise", np.negative, "(-{x})", r"-{x}",
          description="-x", category="arithmetic", vjp=(NEGATE,), text="-{x}", torch="(-{x})", precedence=2),
    OpDef("one_minus", ("x",), "elementwise", lambda x: 1.0 - x, "(1.0f - {x})", r"1 - {x}",
          description="1 - x (coupled gates)", category="arithmetic", vjp=(NEGATE,), text="1 - {x}",
          torch="(1.0 - {x})", precedence=1),
    OpDef("scale", ("x",), "elementwise", None, "({factor} * {x})", r"{factor}\,{x}",
          attrs=("factor",), description="factor * x for a fixed number factor", category="arithmetic",
          vjp=(Vjp("scale", ("dy",)),), text="{factor} * {x}", torch="({factor} * {x})",
          precedence=2),
    OpDef("sigmoid", ("x",), "elementwise", _sigmoid, "sigmoidf_({x})", r"\sigma({x})",
          description="logistic sigmoid", category="activation", vjp=(Vjp("sigmoid_grad", ("dy", "y")),),
          grad_ops=(OpDef("sigmoid_grad", ("dy", "y"), "elementwise", _sigmoid_grad, "({dy} * ({y} * (1.0f - {y})))",
                          r"{dy} \odot {y} \odot (1 - {y})", description="dy * sigmoid'(x), from the output y",
                          category="gradient"),),
          torch="torch.sigmoid({x})", cuda_helper="sigmoidf_"),
    OpDef("tanh", ("x",), "elementwise", np.tanh, "tanhf({x})", r"\tanh({x})",
          description="hyperbolic tangent", category="activation", vjp=(Vjp("tanh_grad", ("dy", "y")),),
          grad_ops=(OpDef("tanh_grad", ("dy", "y"), "elementwise", _tanh_grad, "({dy} * (1.0f - {y} * {y}))",
                          r"{dy} \odot (1 - {y}^2)", description="dy * tanh'(x), from the output y",
                          category="gradient"),),
          torch="torch.tanh({x})"),
    OpDef("relu", ("x",), "elementwise", lambda x: np.maximum(x, 0.0), "fmaxf({x}, 0.0f)",
          r"\mathrm{{relu}}({x})", description="max(x, 0)", category="activation",
          vjp=(Vjp("relu_grad", ("dy", "y")),),
          grad_ops=(OpDef("relu_grad", ("dy", "y"), "elementwise", _relu_grad, "(({y} > 0.0f) ? {dy} : 0.0f)",
                          r"{dy} \odot [{y} > 0]", description="dy where y > 0, else 0 (relu'(0) = 0, as PyTorch)",
                          category="gradient"),),
          torch="torch.relu({x})"),
    OpDef("hard_sigmoid", ("x",), "elementwise", _hard_sigmoid, "hard_sigmoidf_({x})",
          r"\mathrm{{hardsigmoid}}({x})", description="clip(x/6 + 1/2, 0, 1), as PyTorch's Hardsigmoid",
          category="activation", vjp=(Vjp("hard_sigmoid_grad", ("dy", "x")),),
          grad_ops=(OpDef("hard_sigmoid_grad", ("dy", "x"), "elementwise", _hard_sigmoid_grad,
                          "((({x} > -3.0f) && ({x} < 3.0f)) ? {dy} * (1.0f / 6.0f) : 0.0f)",
                          r"\tfrac{{1}}{{6}} {dy} \odot [-3 < {x} < 3]",
                          description="dy / 6 strictly inside (-3, 3), else 0 (as PyTorch)", category="gradient"),),
          torch="F.hardsigmoid({x})", cuda_helper="hard_sigmoidf_"),
    OpDef("identity", ("x",), "elementwise", lambda x: x, "{x}", r"{x}",
          description="x unchanged (names a value, or drops an activation)", category="activation", vjp=(PASS,),
          torch="{x}", flops=0),
    OpDef("exp", ("x",), "elementwise", np.exp, "expf({x})", r"\exp({x})",
          description="e^x (the exponential gate of sLSTM; overflows to inf past x = 88 in float32)",
          category="activation", vjp=(Vjp("mul", ("dy", "y")),), torch="torch.exp({x})"),
    OpDef("softplus", ("x",), "elementwise", _softplus, "softplusf_({x})", r"\mathrm{{softplus}}({x})",
          description="log(1 + e^x), computed as max(x, 0) + log1p(e^-|x|): no overflow",
          category="activation", vjp=(Vjp("softplus_grad", ("dy", "x")),),
          grad_ops=(OpDef("softplus_grad", ("dy", "x"), "elementwise", lambda dy, x: dy * _sigmoid(x),
                          "({dy} * sigmoidf_({x}))", r"{dy} \odot \sigma({x})", description="dy * sigmoid(x)",
                          category="gradient", cuda_helper="sigmoidf_"),),
          torch="(torch.clamp({x}, min=0) + torch.log1p(torch.exp(-torch.abs({x}))))",
          cuda_helper="softplusf_", flops=3),
    OpDef("log_sigmoid", ("x",), "elementwise", _log_sigmoid, "log_sigmoidf_({x})", r"\log\sigma({x})",
          description="log(sigmoid(x)) = -softplus(-x), without overflow (sLSTM's log-space forget gate)",
          category="activation", vjp=(Vjp("log_sigmoid_grad", ("dy", "x")),),
          grad_ops=(OpDef("log_sigmoid_grad", ("dy", "x"), "elementwise", lambda dy, x: dy * _sigmoid(-x),
                          "({dy} * sigmoidf_(-{x}))", r"{dy} \odot \sigma(-{x})", description="dy * sigmoid(-x)",
                          category="gradient", cuda_helper="sigmoidf_"),),
          torch="F.logsigmoid({x})", cuda_helper="log_sigmoidf_", flops=3),
    OpDef("silu", ("x",), "elementwise", _silu, "siluf_({x})", r"\mathrm{{silu}}({x})",
          description="x * sigmoid(x) (SiLU, swish)", category="activation",
          vjp=(Vjp("silu_grad", ("dy", "x")),),
          grad_ops=(OpDef("silu_grad", ("dy", "x"), "elementwise", _silu_grad, "({dy} * silu_gradf_({x}))",
                          r"{dy} \odot \sigma({x}) (1 + {x} (1 - \sigma({x})))",
                          description="dy * (s + x s (1 - s)), s = sigmoid(x)", category="gradient",
                          cuda_helper="silu_gradf_"),),
          torch="F.silu({x})", cuda_helper="siluf_", flops=2),
    OpDef("gelu", ("x",), "elementwise", _gelu, "geluf_({x})", r"\mathrm{{gelu}}({x})",
          description="GELU, tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))", category="activation",
          vjp=(Vjp("gelu_grad", ("dy", "x")),),
          grad_ops=(OpDef("gelu_grad", ("dy", "x"), "elementwise", _gelu_grad, "({dy} * gelu_gradf_({x}))",
                          r"{dy} \odot \mathrm{{gelu}}'({x})", description="dy * gelu'(x) (tanh form)",
                          category="gradient", cuda_helper="gelu_gradf_"),),
          torch="F.gelu({x}, approximate='tanh')", cuda_helper="geluf_", flops=6),
    OpDef("log", ("x",), "elementwise", np.log, "logf({x})", r"\log({x})",
          description="natural logarithm (-inf at 0, NaN below)", category="math",
          vjp=(Vjp("div", ("dy", "x")),), torch="torch.log({x})", domain="positive"),
    OpDef("sqrt", ("x",), "elementwise", np.sqrt, "sqrtf({x})", r"\sqrt{{{x}}}",
          description="square root (NaN below 0)", category="math", vjp=(Vjp("sqrt_grad", ("dy", "y")),),
          grad_ops=(OpDef("sqrt_grad", ("dy", "y"), "elementwise", lambda dy, y: dy * 0.5 / y,
                          "({dy} * 0.5f / {y})", r"\tfrac{{1}}{{2}} {dy} / {y}", description="dy / (2 sqrt(x))",
                          category="gradient"),),
          torch="torch.sqrt({x})", domain="positive"),
    OpDef("rsqrt", ("x",), "elementwise", lambda x: 1.0 / np.sqrt(x), "rsqrtf({x})", r"\frac{{1}}{{\sqrt{{{x}}}}}",
          description="1 / sqrt(x) (LayerNorm's scale)", category="math", vjp=(Vjp("rsqrt_grad", ("dy", "y")),),
          grad_ops=(OpDef("rsqrt_grad", ("dy", "y"), "elementwise", lambda dy, y: -0.5 * dy * y * y * y,
                          "(-0.5f * {dy} * {y} * {y} * {y})", r"-\tfrac{{1}}{{2}} {dy} \odot {y}^3",
                          description="-dy x^(-3/2) / 2, from the output y", category="gradient"),),
          torch="torch.rsqrt({x})", domain="positive"),
    OpDef("abs", ("x",), "elementwise", np.abs, "fabsf({x})", r"\lvert {x} \rvert",
          description="|x|", category="math", vjp=(Vjp("abs_grad", ("dy", "x")),),
          grad_ops=(OpDef("abs_grad", ("dy", "x"), "elementwise", lambda dy, x: dy * np.sign(x),
                          "(({x} > 0.0f) ? {dy} : (({x} < 0.0f) ? -{dy} : 0.0f))", r"{dy} \odot \mathrm{{sign}}({x})",
                          description="dy * sign(x) (0 at 0, as PyTorch)", category="gradient"),),
          torch="torch.abs({x})"),
    OpDef("div", ("a", "b"), "elementwise", np.divide, "({a} / {b})", r"\frac{{{a}}}{{{b}}}",
          description="a / b (inf or NaN where b = 0)", category="arithmetic",
          vjp=(Vjp("div", ("dy", "b")), Vjp("div_grad_b", ("dy", "y", "b"))),
          grad_ops=(OpDef("div_grad_b", ("dy", "y", "b"), "elementwise", lambda dy, y, b: -dy * y / b,
                          "(-{dy} * {y} / {b})", r"-{dy} \odot {y} / {b}", description="-dy a / b^2 = -dy y / b",
                          category="gradient"),),
          text="{a} / {b}", torch="({a} / {b})", precedence=2, latex_groups=True, domain="nonzero_b"),
    OpDef("max", ("a", "b"), "elementwise", np.maximum, "maxf_({a}, {b})", r"\max({a}, {b})",
          description="the larger of a and b (NaN if either is, as np.maximum); at a tie the gradient splits evenly",
          category="arithmetic", vjp=(Vjp("max_grad", ("dy", "a", "b")), Vjp("max_grad", ("dy", "b", "a"))),
          grad_ops=(OpDef("max_grad", ("dy", "a", "b"), "elementwise", _max_grad,
                          "(({a} > {b}) ? {dy} : (({a} == {b}) ? 0.5f * {dy} : 0.0f))",
                          r"{dy} \odot [{a} > {b}]", description="dy where a > b, dy / 2 where a == b, else 0",
                          category="gradient"),),
          torch="torch.maximum({a}, {b})", cuda_helper="maxf_"),
    OpDef("min", ("a", "b"), "elementwise", np.minimum, "minf_({a}, {b})", r"\min({a}, {b})",
          description="the smaller of a and b (NaN if either is, as np.minimum); at a tie the gradient splits evenly",
          category="arithmetic", vjp=(Vjp("min_grad", ("dy", "a", "b")), Vjp("min_grad", ("dy", "b", "a"))),
          grad_ops=(OpDef("min_grad", ("dy", "a", "b"), "elementwise", _min_grad,
                          "(({a} < {b}) ? {dy} : (({a} == {b}) ? 0.5f * {dy} : 0.0f))",
                          r"{dy} \odot [{a} < {b}]", description="dy where a < b, dy / 2 where a == b, else 0",
                          category="gradient"),),
          torch="torch.minimum({a}, {b})", cuda_helper="minf_"),
    # Reductions over the hidden units of each batch row, broadcast back: every unit of the result holds its row's
    # sum (mean). The adjoint of a broadcast sum is the broadcast sum of the adjoint: each rule is its own op.
    OpDef("sum_h", ("x",), "reduction", _sum_h, None, r"\mathrm{{sum}}_H({x})",
          description="the sum over the H units of each row, at every unit (a row's total)", category="reduction",
          vjp=(Vjp("sum_h", ("dy",)),), torch="{x}.sum(-1, keepdim=True).expand_as({x})"),
    OpDef("mean_h", ("x",), "reduction", _mean_h, None, r"\mathrm{{mean}}_H({x})",
          description="the mean over the H units of each row, at every unit (LayerNorm's mean and variance)",
          category="reduction", vjp=(Vjp("mean_h", ("dy",)),), torch="{x}.mean(-1, keepdim=True).expand_as({x})"),
]}



# The ops only a backward step uses: those the forward ops' rules name (their `grad_ops`), then the ones the
# backward step itself is made of. Its other ops are forward ones (mul, neg, scale). The CUDA forms are what the
# fused training step (engine/autodiff/fused_codegen.py) writes; tests/gpu/test_fused_training_gpu.py holds them to
# the NumPy meanings.
_STEP_GRAD_OPS = (
    OpDef("sum", ("terms",), "sum", _sum, None, r"\sum {terms}",
          description="the adjoint of a value read several times: the sum of its consumers' terms",
          category="gradient"),
    OpDef("matmul_t", ("weight", "dy"), "matmul", _matmul_t, None, r"{weight}^\top {dy}",
          description="the operand's adjoint term W^T dy: (B, rows) @ (rows, cols)", category="gradient"),
    OpDef("outer", ("dy", "operand"), "matmul", _outer, None, r"{dy}^\top {operand}",
          description="a weight's gradient dy^T operand, summed over the batch (rows x cols)",
          category="gradient"),
    OpDef("batch_sum", ("dy",), "reduction", _batch_sum, None, r"\textstyle\sum_b {dy}",
          description="a bias's or vector's gradient: its adjoint summed over the batch", category="gradient"),
)
GRAD_OPS: dict[str, OpDef] = {grad.name: grad for op in OPS.values() for grad in op.grad_ops}
GRAD_OPS.update((op.name, op) for op in _STEP_GRAD_OPS)


# ---- views derived from the table: computed on use, so an op added by `register` is in every one ------------

def activations() -> tuple[str, ...]:
    """The activations, in table order: the designer's gate and candidate offer them, and the DSL names the
    value an activation reads `<value>_pre`."""
    return tuple(op.name for op in OPS.values() if op.is_activation)


def reductions() -> tuple[str, ...]:
    """The ops over the hidden units of a row (kind "reduction": sum_h, mean_h). The compiled paths run each as a
    matmul by a fixed matrix (engine/dense.py); the NumPy reference and the naive backend run them directly."""
    return tuple(op.name for op in OPS.values() if op.kind == "reduction")


def dsl_functions() -> tuple[str, ...]:
    """The names of engine.dsl's op functions, one per elementwise op without attributes."""
    return tuple(op.dsl_function for op in OPS.values() if op.dsl_function)


def cuda_helpers() -> frozenset[str]:
    """The device helpers of kernels/cell_ops.cuh that ops' CUDA forms call: generated code never names a
    variable like one of them."""
    return frozenset(op.cuda_helper for op in [*OPS.values(), *GRAD_OPS.values()] if op.cuda_helper)


_LISTENERS: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call `listener()` after every register/unregister: for lists built once from the table (engine.dsl's
    functions, the designer's palette)."""
    _LISTENERS.append(listener)


def register(op: OpDef) -> None:
    """Add `op` (and the backward ops in its grad_ops) to the tables; every derived view follows."""
    taken = [name for name in (op.name, *(g.name for g in op.grad_ops))
             if name in OPS or name in GRAD_OPS or name in LEAF_KINDS]
    if taken:
        raise ValueError(f"op name '{taken[0]}' is taken; hint: give the new op (or its backward op) another name")
    OPS[op.name] = op
    GRAD_OPS.update((grad.name, grad) for grad in op.grad_ops)
    for listener in _LISTENERS:
        listener()


def unregister(name: str) -> OpDef:
    """Remove op `name` (and its backward ops) from the tables again; returns its definition."""
    op = OPS.pop(name)
    for grad in op.grad_ops:
        GRAD_OPS.pop(grad.name, None)
    for listener in _LISTENERS:
        listener()
    return op


def needs_parens(child: str, parent: str, right: bool = False) -> bool:
    """Whether an inlined `child` expression must be parenthesised as an operand of `parent` in the equations
    (engine/equations.py, LaTeX and plain text alike): it binds less tightly (OpDef.precedence), or it is the
    right operand of a subtraction or division at the same level (a - (b - c), 1 - (a + b), a / (b * c);
    `one_minus` subtracts its operand). Function-style ops (sigmoid(...)) never need them."""
    mine, theirs = OPS[child].precedence if child in OPS else None, OPS[parent].precedence if parent in OPS else None
    if mine is None or theirs is None:
        return False
    subtracted = parent == "one_minus" or (right and parent in ("sub", "div"))
    return mine < theirs or (subtracted and mine == theirs)


def op_def(name: str) -> OpDef:
    return OPS[name]


def apply_elementwise(op: str, args: list, attrs: dict):
    """The reference meaning of an elementwise op on NumPy arrays."""
    if op == "scale":
        return attrs["factor"] * args[0]
    return OPS[op].numpy(*args)


def apply_backward(op: str, args: list, attrs: dict):
    """The reference meaning of a backward op: one of GRAD_OPS, or a forward elementwise op (mul, neg, scale). A
    weight's gradient (outer) of a weight of heads keeps only its blocks (attrs["heads"])."""
    if op == "outer":
        return outer_heads(*args, attrs.get("heads", 1))
    if op in GRAD_OPS:
        return GRAD_OPS[op].numpy(*args)
    return apply_elementwise(op, args, attrs)


def backward_op_def(name: str) -> OpDef | None:
    """The definition of an op a gradient rule names (GRAD_OPS first, then the forward table), or None."""
    return GRAD_OPS.get(name) or OPS.get(name)
