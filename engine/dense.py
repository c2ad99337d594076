"""A cell in dense form: what the compiled paths run (the Plan and its fused kernels, the wavefront schedules, the
generated training step, the exported program).

Two things a cell may hold that those paths do not take as they are; the dense form rewrites both into what they
take, a matmul by a plain (rows x cols) weight:
- a weight of heads, `W("R", heads=k)`, stored as k blocks (k, rows/k, cols/k): in dense form one block-diagonal
  (rows x cols) weight, the blocks placed on its diagonal at upload and its gradient read back from them, marked
  with attr `diagonal=k`. Multiplied as it is, it costs k times the block FLOPs (the zeros too), correct on every
  compiled path; the persistent schedule skips the zeros where a block's hidden units lie in one head
  (engine/schedules/heads.py gemm_heads: the GEMM reads only that head's K/k columns).
- a reduction over the hidden units, `sum_h(v)` or `mean_h(v)`: every unit of its result holds the row's sum
  (mean), which is the matmul of v by the fixed H x H matrix of ones (of 1/H). The fixed matrix is a weight of the
  dense cell only (named `J_sum_h` / `J_mean_h`, or with a suffix where the cell uses that name), filled here; its
  gradient, which the training step computes with the others, is dropped. A reduction then costs what a GEMM of
  H x H does, and on the wavefront schedules a stage of its own: the cross-block step is the stage barrier that
  every in-step matmul already has (the blocks own slices of H; the matmul reads the whole row).

The NumPy reference and the naive backend run the cell as it is (einsum per head, a row reduction): they are what
the dense form is checked against. Pure functions of frozen data, cached: the rewrite happens once per cell.

    form = dense_form(cell)                        # .cell, .fixed {name: "sum_h" | "mean_h"}, .heads {name: k}
    net, p = dense_network(network), dense_params(network, params)
    grads = compact_gradients(network, dense_grads)   # per layer: the cell's own parameters and shapes again
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .ir import CellGraph, Node, make_node
from .network import Network
from .ops import OPS, array_module
from .params import Params, check_params


@dataclass(frozen=True)
class DenseForm:
    cell: CellGraph                              # the dense cell (the cell itself when there is nothing to rewrite)
    fixed: tuple[tuple[str, str], ...] = ()      # (weight name, "sum_h" | "mean_h"): the fixed matrices added
    heads: tuple[tuple[str, int], ...] = ()      # (weight name, k): weights stored as k blocks

    @property
    def changed(self) -> bool:
        return bool(self.fixed or self.heads)


def needs_dense(cell: CellGraph) -> bool:
    """Whether the cell has a weight of heads or a reduction (what the compiled paths take only in dense form)."""
    return dense_form(cell).changed


def _fresh(base: str, taken: set[str]) -> str:
    """base, or base_2, base_3, ...: the first not in `taken`, which it joins (a fixed matrix's weight name)."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


@lru_cache(maxsize=256)
def dense_form(cell: CellGraph) -> DenseForm:
    heads = tuple((n.name, n.attr("heads")) for n in cell.nodes if n.op == "weight" and n.attr("heads", 1) > 1)
    used = sorted({n.op for n in cell.nodes if n.op in OPS and OPS[n.op].kind == "reduction"})
    if not heads and not used:
        return DenseForm(cell)
    taken = set(cell.by_name)
    fixed = {op: _fresh(f"J_{op}", taken) for op in used}
    # attr `fixed` marks the matrix as the reduction's (the wavefront schedules sum rows instead of multiplying by
    # it: reduction_terms); a cell read from JSON cannot carry it (engine.serialize refuses it).
    nodes: list[Node] = [make_node(name, "weight", rows="H", cols="H", fixed=op) for op, name in fixed.items()]
    for n in cell.nodes:
        if n.op == "weight" and n.attr("heads", 1) > 1:
            nodes.append(make_node(n.name, "weight", rows=n.attr("rows"), cols=n.attr("cols"), diagonal=n.attr("heads")))
        elif n.op in fixed:
            nodes.append(make_node(n.name, "matmul", (fixed[n.op], n.args[0])))
        else:
            nodes.append(n)
    dense = CellGraph(cell.name, tuple(nodes), cell.states, cell.output, cell.doc, cell.input_is_hidden)
    return DenseForm(dense, tuple((name, op) for op, name in fixed.items()), heads)


@lru_cache(maxsize=64)
def dense_network(network: Network) -> Network:
    """The network with its cell in dense form (the network itself when there is nothing to rewrite)."""
    form = dense_form(network.cell)
    if not form.changed:
        return network
    return Network(form.cell, network.input_size, network.hidden_size, network.num_layers, network.proj_size)


def block_diagonal(weight):
    """The dense (rows x cols) matrix of a weight: a weight of heads (k, r, c) placed block by block on the diagonal
    of a (k r x k c) matrix of zeros; a 2-D weight as it is."""
    if weight.ndim != 3:
        return weight
    xp = array_module(weight)
    k, r, c = weight.shape
    dense = xp.zeros((k * r, k * c), dtype=weight.dtype)
    for j in range(k):
        dense[j * r:(j + 1) * r, j * c:(j + 1) * c] = weight[j]
    return dense


def diagonal_blocks(dense, heads: int):
    """The k diagonal blocks (k, rows/k, cols/k) of a dense (rows x cols) matrix: a heads weight's gradient."""
    xp = array_module(dense)
    rows, cols = dense.shape
    r, c = rows // heads, cols // heads
    return xp.stack([dense[j * r:(j + 1) * r, j * c:(j + 1) * c] for j in range(heads)])


def fixed_matrix(op: str, hidden: int, dtype, xp=np):
    """The H x H matrix a reduction multiplies by: ones for sum_h, 1/H for mean_h."""
    return xp.full((hidden, hidden), 1.0 if op == "sum_h" else 1.0 / hidden, dtype=dtype)


def dense_params(network: Network, params: Params) -> Params:
    """The parameters of dense_network(network): heads weights as block-diagonal matrices, the fixed matrices
    added (in the dtype of the layer's other parameters, on the same device)."""
    form = dense_form(network.cell)
    if not form.changed:
        return params
    heads = dict(form.heads)
    layers = []
    for layer in params.layers:
        values = {name: block_diagonal(value) if name in heads else value for name, value in layer.items()}
        sample = next(iter(layer.values()))
        for name, op in form.fixed:
            values[name] = fixed_matrix(op, network.hidden_size, sample.dtype, array_module(sample))
        layers.append(values)
    return Params(layers)


def compact_gradients(network: Network, grads: list[dict]) -> list[dict]:
    """Per layer, the gradients of dense_network(network)'s parameters as the cell's own: the fixed matrices'
    dropped, each heads weight's read back from its diagonal blocks."""
    form = dense_form(network.cell)
    if not form.changed:
        return grads
    fixed, heads = {name for name, _ in form.fixed}, dict(form.heads)
    return [{name: diagonal_blocks(g, heads[name]) if name in heads else g for name, g in layer.items()
             if name not in fixed} for layer in grads]


def dense(network: Network, params: Params) -> tuple[Network, Params]:
    """(dense_network(network), dense_params(network, params)), the parameters checked against the cell's own shapes
    first (check_params names what is wrong). What each compiled path does where its network and parameters enter."""
    check_params(network, params)
    return dense_network(network), dense_params(network, params)


# ---- the wavefront schedules' form: a variance as one reduction -------------------------------------------------

def _adds(cell: CellGraph, name: str) -> list[str]:
    """The summands of an add tree (the node itself when it is not an add)."""
    node = cell[name]
    return _adds(cell, node.args[0]) + _adds(cell, node.args[1]) if node.op == "add" else [name]


def _fixed_matmuls(cell: CellGraph, name: str, op: str) -> list[str] | None:
    """The matmuls by the fixed matrix of `op` that make the mean (of n values: their means added, times 1/n) at
    `name`, or None when `name` is not such a mean."""
    node = cell[name]
    factor, summands = 1.0, [name]
    if node.op == "scale":
        factor, summands = node.attr("factor"), _adds(cell, node.args[0])
    leaves = [cell[s] for s in summands]
    if not all(n.op == "matmul" and cell[n.args[0]].attr("fixed") == op for n in leaves):
        return None
    return summands if abs(factor * len(summands) - 1.0) < 1e-12 else None


def variance_form(cell: CellGraph) -> CellGraph:
    """The dense cell with every variance of a layer_norm (engine.dsl), mean_h((v_k - mu)^2) over the parts v_k whose
    joint mean is mu, rewritten as matmuls by a fixed matrix marked "var_h", one per variance: the wavefront schedules
    sum each block's units around their own mean and combine the blocks' sums in the stage that adds up mu (Chan,
    Golub & LeVeque's pairwise update), so a LayerNorm's mean and variance take one barrier instead of two
    (engine/codegen/reductions.py). A term of var_h matmuls over v_1..v_n is sum_k mean_h((v_k - mean of all)^2).
    Only the wavefront schedules run this form: a matmul path would multiply by the matrix. A cell with no
    variance to rewrite comes back as the same object."""
    rewritten = _variance_rewrite(cell)
    return cell if rewritten is None else rewritten


@lru_cache(maxsize=256)
def _variance_rewrite(cell: CellGraph) -> CellGraph | None:
    """variance_form's rewrite, cached by the (frozen, hashable) cell; None where nothing is rewritten, so that the
    caller gets its own object back rather than an equal one cached from an earlier call."""
    rewrites: dict[str, Node] = {}
    added: list[Node] = []
    taken = set(cell.by_name)
    for n in cell.nodes:
        leaves = _fixed_matmuls(cell, n.name, "mean_h") if n.op in ("scale", "matmul") else None
        if not leaves or any(leaf in rewrites for leaf in leaves):
            continue
        squares = [cell[cell[leaf].args[1]] for leaf in leaves]
        if not all(sq.op == "mul" and sq.args[0] == sq.args[1] and cell[sq.args[0]].op == "sub" for sq in squares):
            continue
        centred = [cell[sq.args[0]] for sq in squares]
        mu = {c.args[1] for c in centred}
        if len(mu) != 1:
            continue
        parts = [c.args[0] for c in centred]
        means = _fixed_matmuls(cell, mu.pop(), "mean_h")
        if means is None or sorted(cell[m].args[1] for m in means) != sorted(parts):
            continue
        name = _fresh("J_var_h", taken)
        added.append(make_node(name, "weight", rows="H", cols="H", fixed="var_h"))
        for leaf, part in zip(leaves, parts):
            rewrites[leaf] = make_node(leaf, "matmul", (name, part))
    if not rewrites:
        return None
    body = added + [rewrites.get(n.name, n) for n in cell.nodes]
    return CellGraph(cell.name, tuple(body), cell.states, cell.output, cell.doc, cell.input_is_hidden)


def variance_network(network: Network, params: Params) -> tuple[Network, Params]:
    """A dense network and its parameters in variance_form: the var_h matrices as zeros (never multiplied)."""
    wave = wavefront_network(network)
    if wave is network:
        return network, params
    fixed = [n.name for n in wave.cell.nodes if n.op == "weight" and n.attr("fixed") == "var_h"]
    layers = []
    for layer in params.layers:
        sample = next(iter(layer.values()))
        zeros = array_module(sample).zeros((network.hidden_size, network.hidden_size), dtype=sample.dtype)
        layers.append({**layer, **{name: zeros for name in fixed}})
    return wave, Params(layers)


def wavefront_network(network: Network) -> Network:
    """The network as the wavefront schedules compile it: the dense form, then variance_form."""
    dense_net = dense_network(network)
    cell = variance_form(dense_net.cell)
    if cell is dense_net.cell:
        return dense_net
    return Network(cell, network.input_size, network.hidden_size, network.num_layers, network.proj_size)


def reduction_terms(cell: CellGraph, gemm) -> tuple[tuple[tuple[str, str], ...], ...] | None:
    """A GEMM (engine.plan.Gemm) of reductions only, every matmul in it by a fixed matrix (attr `fixed`: sum_h,
    mean_h, or the var_h of variance_form) and no folded bias: per term, its (operand, op) pairs. None for any other
    GEMM (the passes never mix the two kinds in one GEMM: engine/passes/gemms.py)."""
    out = []
    for term in gemm.terms:
        pairs = []
        for m in term.matmuls:
            weight, operand = cell[m].args
            op = cell[weight].attr("fixed")
            if op is None or term.biases or term.dim != "H":
                return None
            pairs.append((operand, op))
        out.append(tuple(pairs))
    return tuple(out)
