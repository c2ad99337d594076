"""Unusual cells that exercise corners of the compiler the presets do not reach.

Each is a valid cell whose meaning the NumPy reference defines; the compiler tests run them through
every pass combination and compare. Imported by tests/test_passes.py, test_plan_structure.py,
test_codegen.py and test_export.py (pytest puts tests/ on sys.path).
"""
from __future__ import annotations

from engine import dsl
from engine.dsl import (
    W,
    b,
    cell,
    const,
    exp,
    gelu,
    hard_sigmoid,
    identity,
    log,
    log_sigmoid,
    relu,
    rsqrt,
    sigmoid,
    silu,
    softplus,
    sqrt,
    tanh,
    v,
)


@cell
def shared_operand(x, h, c):
    """Two sums over one stage share h but only one reads c: one GEMM over [h, c] with a zero block."""
    a = tanh(W("W_a") @ x + W("U_a") @ h + W("V_a") @ c + b("b_a"))
    z = sigmoid(W("W_z") @ x + W("U_z") @ h)
    c_next = a * z + c
    h_next = tanh(c_next)
    return {"h": h_next, "c": c_next}


@cell
def disjoint_operands(x, h, c):
    """Two recurrent matmuls of the same stage that share nothing: two GEMMs, not one."""
    h_next = tanh(W("U") @ h + W("W") @ x)
    c_next = relu(W("V") @ c)
    return {"h": h_next, "c": c_next}


@cell
def reused_matmul(x, h):
    """A matmul used twice (in a sum and in a product) stays its own GEMM block."""
    m = W("U") @ h
    a = tanh(m + W("W") @ x + b("b"))
    h_next = a * m
    return {"h": h_next}


@cell
def doubled_summand(x, h):
    """The same matmul node added twice: its weight counts twice in the packed block."""
    u = W("U") @ h
    h_next = tanh(u + u + W("W") @ x)
    return {"h": h_next}


@cell
def constants(x, h):
    """Constant expressions (folded at compile time) and a constant summand folded into a bias."""
    shift = const(2.0) * 0.25
    f = sigmoid(W("W_f") @ x + W("U_f") @ h + shift)
    h_next = f * h + (1 - f) * tanh(W("W_c") @ x + 0.5 * h)
    return {"h": h_next}


@cell
def dead_value(x, h):
    """A value nothing needs (pruned) next to a real update."""
    unused = tanh(W("U_dead") @ h)  # noqa: F841 (the DSL names the node after the variable)
    h_next = tanh(W("W") @ x + W("U") @ h + b("b"))
    return {"h": h_next}


@cell
def linear_states(x, h, c):
    """Next values that are not computed by a kernel: a GEMM block (c) and another state (h)."""
    c_next = W("U") @ h
    return {"h": c, "c": c_next}


@cell
def input_sized(x, h):
    """Values of size I inside a step: an input-sized gate, a weight with I rows, a second stage."""
    gx = x * sigmoid(v("p_x", dim="I") * x)
    p = tanh(W("P", rows="I") @ h)
    h_next = tanh(W("W") @ gx + W("U") @ h + W("Q") @ p)
    return {"h": h_next}


@cell
def three_stages(x, h):
    """A chain of dependent recurrent matmuls: three GEMM stages in one step."""
    r = sigmoid(W("W_r") @ x + W("U_r") @ h)
    s = sigmoid(W("U_s") @ (r * h))
    h_next = tanh(W("W_n") @ x + W("U_n") @ (s * h) + b("b_n"))
    return {"h": h_next}


@cell
def adjoint_from_gemm(x, h, s):
    """A state's adjoint that is a GEMM's output unchanged and a term of another sum (found by the fuzzer): v = h + u
    is read by U2 alone, so h's adjoint is U2^T d(pre) itself, and d(u) = d(tanh) + d(v) must not take that GEMM."""
    u = W("U1") @ s
    v = h + u
    return {"h": tanh(u), "s": tanh(W("U2") @ v + W("W") @ x)}


@cell
def clashing_names(x, h):
    """Node names that clash with C keywords and with the kernel's own variables."""
    j = W("U") @ h
    float_ = tanh(j + W("W") @ x).named("float")
    b_ = sigmoid(float_).named("b")
    h_next = b_ * float_ + v("t") * h
    return {"h": h_next}


@cell
def every_op(x, h, k):
    """Every op of the op table, a subtraction of a matmul, constants in and out of sums, and a next
    state computed from a parameter alone. The ops with a restricted domain (log, sqrt, rsqrt, div) get
    operands inside it, so random parameters give finite values."""
    a = W("W_x") @ x + b("b_a") - W("W_h") @ h
    gate = hard_sigmoid(3.0 * a) * sigmoid(const(0.5))
    mix = (1 - gate) * tanh(identity(a)) + gate * relu(-a)
    smooth = silu(a) + gelu(a) - log_sigmoid(a) + softplus(-a) + exp(-abs(a))
    ratio = dsl.max(a, h) / (2 + abs(dsl.min(a, k)))
    roots = sqrt(abs(h) + 0.5) * rsqrt(1 + abs(k)) + log(2 + abs(a))
    centred = mix - dsl.mean_h(mix)                     # the reductions over H: a row's mean and sum
    spread = centred * rsqrt(1 + dsl.sum_h(centred * centred))
    h_next = mix - 0.25 * (v("p") * k) + 1.5 + 0.125 * (smooth * ratio - roots) + 0.5 * spread
    k_next = sigmoid(b("b_k"))
    return {"h": h_next, "k": k_next}


@cell
def projection_only(x, h):
    """The next state is the hoisted input projection itself (h_{t-1} is never read)."""
    h_next = W("W") @ x
    return {"h": h_next}


@cell
def shared_weight(x, h, c):
    """One weight applied to two operands, and twice to the same operand in one sum."""
    u1 = W("U") @ h
    u2 = W("U") @ h
    c_next = tanh(u1 + u2 + W("U") @ c + W("W") @ x)
    h_next = sigmoid(c_next)
    return {"h": h_next, "c": c_next}


CELLS = {c.name: c for c in (every_op, projection_only, shared_weight, shared_operand, disjoint_operands, reused_matmul, doubled_summand, constants,
                             dead_value, linear_states, input_sized, three_stages, adjoint_from_gemm, clashing_names)}
