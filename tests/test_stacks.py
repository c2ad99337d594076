"""Stacks of the fused training step (engine/autodiff/fused_plan.py Stack): the matmuls of several states as one GEMM
over the states side by side, each way. The plan's shape, the refusals, and every kind of stacked cell run by the
NumPy runner (buffers poisoned) against the float64 reference, plain, fused and split."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused_training_plan import assert_close, run_plan_on_numpy

import engine
from engine.autodiff import fused_numpy
from engine.autodiff.fused_describe import describe
from engine.autodiff.fused_plan import OUTPUT_BUFFER
from engine.autodiff.fused_planner import MAX_ZERO_SHARE, training_plan
from engine.autodiff.stage_fusion import fused_stages, lay_out
from engine.dsl import W, b, cell, sigmoid, tanh


@cell
def two_sums(x, h, s):
    """Both sums read both states, which nothing else reads: a full grid, both ways one GEMM."""
    a = tanh(W("W_a") @ x + W("R_ah") @ h + W("R_as") @ s + b("b_a"))
    g = sigmoid(W("R_gh") @ h + b("b_g") + W("R_gs") @ s)
    return {"h": a * g, "s": a - g}


@cell
def one_adjoint_elementwise(x, h, s):
    """h is also read elementwise, s only by matmuls: their adjoints are not alike, so the backward keeps a GEMM a
    state (writing into the stacked adjoints' columns) while the forward stacks."""
    a = tanh(W("W_a") @ x + W("R_ah") @ h + W("R_as") @ s)
    g = sigmoid(W("R_gh") @ h + W("R_gs") @ s + b("b_g"))
    return {"h": a * g + h * g, "s": a}


@cell
def both_adjoints_elementwise(x, h, s):
    """Both states read elementwise too: the backward GEMM adds to what the kernel wrote (beta = 1), stacked."""
    a = tanh(W("W_a") @ x + W("R_ah") @ h + W("R_as") @ s)
    g = sigmoid(W("R_gh") @ h + W("R_gs") @ s + b("b_g"))
    return {"h": a * g + h * 0.5, "s": a * s}


@cell
def shared_term(x, h, s, q):
    """R_h h is read by two values: a sum of its own (its column block alone, zeros for s and q), while G_s s and
    G_q q add to it in another sum (whose first term then reads the GEMM and the second 0). 3 zeros of 12."""
    m = W("R_h") @ h
    a = tanh(W("W_a") @ x + W("A_h") @ h + W("A_s") @ s + W("A_q") @ q + b("b_a"))
    g = sigmoid(m + W("G_s") @ s + W("G_q") @ q)
    r = sigmoid(W("R_rh") @ h + W("R_rs") @ s + W("R_rq") @ q)
    return {"h": a * sigmoid(m), "s": a * g, "q": g * r}


@cell
def block_diagonal(x, h, s):
    """Each sum reads one state: half the grid would be zeros, so no stack."""
    return {"h": tanh(W("W") @ x + W("R_h") @ h), "s": tanh(W("W_s") @ x + W("R_s") @ s)}


@cell
def weight_twice(x, h, s):
    """One weight for two states: no stack (its grid would hold it twice)."""
    return {"h": tanh(W("W") @ x + W("R") @ h + W("R") @ s), "s": sigmoid(W("R_s") @ s + W("R_h") @ h)}


@cell
def one_state_twice_in_a_sum(x, h, s):
    """Two matmuls of h in one sum: no stack (a grid block would be their weights' sum)."""
    return {"h": tanh(W("A") @ h + W("B") @ h + W("C") @ s + W("W") @ x), "s": sigmoid(W("D") @ s + W("E") @ h)}


STACKED = {c.name: c for c in (two_sums, one_adjoint_elementwise, both_adjoints_elementwise)}
UNSTACKED = {c.name: c for c in (block_diagonal, weight_twice, one_state_twice_in_a_sum)}


def stack_gemms(step) -> list:
    return [g for g in step.gemms if g.grid > 1]


def test_lstm_fgr_is_one_gemm_and_one_kernel_each_way():
    plan = training_plan(engine.preset("lstm_fgr").cell)
    (st,) = plan.stacks
    assert st.states == ("h", "i", "f", "o") and len(st.roots) == 4
    assert st.weights[:4] == ("R_z", "", "", "")                    # z reads h alone: three zero blocks of 16
    assert st.weights[4:8] == ("R_i", "R_ii", "R_fi", "R_oi")
    assert plan.launches_per_step == (2, 2)
    (forward,), (backward,) = stack_gemms(plan.forward), stack_gemms(plan.backward)
    assert forward.weights == backward.weights == st.weights and forward.stack == backward.stack
    assert forward.operand.buffer == "state_stack_H" and backward.out.buffer == "dstate_stack_H"
    assert not backward.accumulate                                  # h, i, f, o are read by the matmuls alone
    # the kernel reads each sum once, at its first term, and 0 for the others
    kernel = plan.forward.order[1][1]
    loads = dict(kernel.loads)
    assert loads["R_i_h"].buffer == "gemm_stack_H" and loads["R_ii_i"].kind == "literal" == loads["R_oi_o"].kind
    assert loads["R_ii_i"].literal == 0.0
    # the output state lies in the stack, so the kernel stores it again, whole, for the next layer
    assert plan.output.buffer == OUTPUT_BUFFER and ("h_next", plan.output) in kernel.stores
    stages = fused_stages(plan)
    assert sorted((s.forward, s.members) for s in stages.values()) == [(False, 4), (True, 4)]
    text = describe(plan)
    assert "GEMM lstm_fgr_fwd_stack_H_s0" in text
    assert ("stack: states h, i, f, o side by side (K = 4H); sums z_pre, i_next_pre, f_next_pre, o_next_pre one GEMM "
            "each way, a grid of 4 x 4 weight blocks, 3 zero") in text
    # the weight gradients read the states where they lie, the sums' dy side by side
    grads = {g.params: g for g in plan.grad_gemms}
    assert grads[("R_ii", "R_if", "R_io")].operand == plan.state_places["i"]
    assert grads[("R_z", "R_i", "R_f", "R_o")].dy.buffer == "dy_stack_H_0"


@pytest.mark.parametrize("name", sorted(STACKED))
def test_stacked_cells_stack_as_described(name):
    plan = training_plan(STACKED[name])
    (st,) = plan.stacks
    assert st.states == ("h", "s")
    assert len(stack_gemms(plan.forward)) == 1
    backward = stack_gemms(plan.backward)
    if name == "one_adjoint_elementwise":
        assert backward == [] and {g.out.buffer for g in plan.backward.gemms if not g.hoisted} == {"dstate_stack_H"}
    else:
        (gemm,) = backward
        assert gemm.accumulate == (name == "both_adjoints_elementwise")


@pytest.mark.parametrize("name", sorted(UNSTACKED))
def test_cells_that_must_not_stack_do_not(name):
    plan = training_plan(UNSTACKED[name])
    assert plan.stacks == () and stack_gemms(plan.forward) == []


def test_a_term_read_elsewhere_is_a_sum_of_its_own():
    plan = training_plan(shared_term)
    (st,) = plan.stacks
    assert st.states == ("h", "s", "q") and st.members[0] == ("m", "", "")
    loads = dict(plan.forward.order[1][1].loads)
    assert loads["m"].buffer == "gemm_stack_H"
    firsts = [loads[name] for name in ("G_s_s", "G_q_q") if name in loads]
    assert sorted(p.kind for p in firsts) == ["literal", "row"]


def test_the_zero_share_limit_is_the_one_the_plan_keeps():
    assert MAX_ZERO_SHARE < 0.5                                     # block_diagonal's half is out
    assert 3 / 16 <= MAX_ZERO_SHARE                                 # lstm_fgr's 3 of 16 is in


CASES = {**STACKED, **UNSTACKED, "shared_term": shared_term, "lstm_fgr": engine.preset("lstm_fgr").cell}


@pytest.mark.parametrize("sizes", [dict(I=3, H=5, T=5, B=3), dict(I=8, H=8, T=4, B=1), dict(I=8, H=8, T=4, B=2)],
                         ids=["plain", "fused-1", "fused-2"])
@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_stacked_plans_run_by_numpy_equal_the_reference(name, wavefront, sizes):
    assert_close(run_plan_on_numpy(CASES[name], seed=7, layers=3, wavefront=wavefront, **sizes))


@pytest.mark.parametrize("name", ["lstm_fgr", "both_adjoints_elementwise", "one_adjoint_elementwise"])
def test_stacked_plans_with_split_gemms_equal_the_reference(name, monkeypatch):
    monkeypatch.setattr(fused_numpy, "SPLIT", True)
    assert_close(run_plan_on_numpy(CASES[name], seed=3, layers=2, I=6, H=4, T=4, B=3))


def test_a_stacks_grid_is_laid_out_for_its_fused_launches():
    """The backward's fused launch reads the grid transposed; with the tiled form, a unit's four state columns side
    by side."""
    plan = training_plan(engine.preset("lstm_fgr").cell)
    backward = next(s for s in fused_stages(plan).values() if not s.forward)
    assert backward.weight_layout(False) == (backward.gemm.stack, "transposed", 1)   # the GEMV finds the rows
    key, layout, members = backward.weight_layout(True)
    assert key == backward.gemm.stack and layout == "transposed" and members == 4
    H = 3
    grid = np.arange(4 * H * 4 * H, dtype=np.float32).reshape(4 * H, 4 * H)       # (sums x states) rows x cols
    laid = lay_out(np, grid, layout, members)
    for j in range(H):
        for m in range(4):
            np.testing.assert_array_equal(laid[j * 4 + m], grid[:, m * H + j])     # state m's column j


def test_the_fused_gemv_skips_a_stacks_zero_blocks():
    """z reads h alone: forward, z's warps read K from 0 to H; backward, the warps of i, f and o skip z's dy."""
    from engine.autodiff.fused_codegen import render_module
    from engine.plan import Lin
    plan = training_plan(engine.preset("lstm_fgr").cell)
    (forward,), (backward,) = stack_gemms(plan.forward), stack_gemms(plan.backward)
    H, K = Lin.of("H"), Lin.of("H", 4)
    assert forward.k_ranges(True) == ((Lin(), H), (Lin(), K), (Lin(), K), (Lin(), K))
    assert backward.k_ranges(False) == ((Lin(), K), (H, K), (H, K), (H, K))
    source = render_module(plan)
    assert "member == 0 ? (H) : member == 1 ? (4 * H)" in source
    assert "member == 0 ? (0) : member == 1 ? (H)" in source
    # a GEMM without a grid reads all of K
    assert "const int member" not in render_module(training_plan(engine.preset("lstm").cell))
