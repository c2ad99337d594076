"""The scan schedule's gradients: backpropagation through a linear recurrence without stepping through time.

For a scanned state s[t] = a[t] * s[t-1] + b[t] (engine/passes/scan.py), the adjoint g[t] = dL/ds[t] obeys the same
recurrence backwards, g[t] = d[t] + a[t+1] * g[t+1], where d[t] is what reads s[t] directly (the outputs, the final
state, the values computed after the scan, s[t] read at t+1 by those). So the backward is one more scan, run on
reversed arrays, and then

    da[t] = g[t] * s[t-1],   db[t] = g[t],   d initial = a[0] * g[0],

after which every state-free value is differentiated for the whole sequence at once: the coefficients' expressions
(Expr.grad), then the cell's state-free nodes in reverse order through their ops' gradient rules (engine/ops.py,
the same rules the step-by-step backward uses), each on T x B rows; a weight's gradient is one GEMM over all rows,
a bias's a sum over them. Layers go top to bottom; a layer's input adjoint is the next lower layer's output adjoint.

NumPy or CuPy alike (xp); the forward keeps every state-free value of the sequence (the memory of one forward's
values, as the step-by-step tape keeps). Checked against engine.bptt in tests/test_scan.py and on the GPU in
tests/gpu/test_scan_gpu.py.
"""
from __future__ import annotations

import numpy as np

from ..autodiff.gradients import Gradients
from ..backends.common import check_training_precision
from ..dense import compact_gradients, dense
from ..errors import BackendError
from ..ops import OPS, apply_backward
from ..rounding import round_like
from . import scan_kernel
from .scan import (
    after_the_scan,
    analysis_or_refusal,
    check_mode,
    cuda_scan,
    group_offsets,
    kernel_inputs,
    module_of,
    sequential_scan,
    walk_inputs,
    walk_launch,
    walk_plan,
)
from .scan_backward_kernel import BACK, backward_source, walk_back_source
from .scan_modes import Products, fixed_weight
from .scan_values import (
    as_dtype,
    contiguous,
    evaluate,
    full_array,
    grouped_matmuls,
    initial_state,
    matmuls_by_operand,
    stacked_weights,
)


def _reduce_to(term, shape, xp):
    """`term` summed over the rows it was broadcast to (a bias or vector read by every row, a number)."""
    term = xp.asarray(term)
    if term.shape == tuple(shape):
        return term
    if len(shape) == 0:
        return term.sum()
    # batch_sum: on the GPU a GEMV with a row of ones; CuPy's own sum over the first axis of the T x B rows took
    # ~0.8 ms for 32768 x 512 floats, most of the backward's time outside its GEMMs (minGRU, T = 4096, B = 8).
    return apply_backward("batch_sum", [xp.ascontiguousarray(term.reshape(-1, shape[-1]))], {}).reshape(shape)


def scan_gradients(network, params, x, initial_states: dict | None = None, d_outputs=None,
                   d_final_states: dict | None = None, dtype=np.float64, xp=np, scan=None,
                   input_gradient: bool = True, precision: str = "float32") -> Gradients:
    """engine.bptt's result for a cell that runs as a scan, computed as scans (see the module docstring). A cell of
    heads or reductions runs in its dense form (engine/dense.py); its gradients come back in the cell's own shapes.
    input_gradient=False: gradients.x is None (the walks leave its GEMM out). precision: "tf32", "float16" or
    "bfloat16" rounds both operands of every matmul of both passes (engine/schedules/scan_modes.py), float32 only."""
    precision = check_mode(check_training_precision("the scan's gradients", precision), dtype, xp)
    source = network
    network, params = dense(network, params)
    grads = _scan_gradients(network, params, x, initial_states, d_outputs, d_final_states, dtype, xp, scan,
                            input_gradient, Products(precision, xp))
    grads.params = compact_gradients(source, grads.params)
    if not input_gradient:
        grads.x = None
    return grads


def _scan_gradients(network, params, x, initial_states, d_outputs, d_final_states, dtype, xp, scan,
                    input_gradient: bool, products: Products) -> Gradients:
    cell = network.cell
    found = analysis_or_refusal(cell)
    plan = walk_plan(network, x, dtype, xp, products.precision) if scan is None and xp is not np else None
    if plan is not None:
        return walk_gradients(network, params, x, initial_states, d_outputs, d_final_states, dtype, xp, plan,
                              input_gradient, products)
    if scan is None and xp is not np and fast_path_fits(cell):
        return fast_gradients(network, params, x, initial_states, d_outputs, d_final_states, dtype, xp, products)
    if scan is None:
        scan = sequential_scan if xp is np else cuda_scan(dtype)
    T, B, _ = x.shape
    rows = T * B
    nexts = {s.name: s.next for s in cell.states}
    post, _ = after_the_scan(cell)
    free = [n for n in cell.topo_order if n in found.free]
    layer_in = xp.asarray(x, dtype=dtype)
    tapes = []
    for layer in range(network.num_layers):                    # forward, keeping the sequence's values
        lp = {k: xp.asarray(v, dtype=dtype) for k, v in params[layer].items()}
        env = {n.name: layer_in.reshape(rows, -1) for n in cell.nodes if n.op == "input"}
        evaluate(cell, free, env, lp, xp, products)
        tape = {"env": env, "params": lp, "input": layer_in, "scanned": {}}
        for state, affine in found.scanned.items():
            n = network.state_size(state)
            initial = initial_state(initial_states, state, layer, (B, n), dtype, xp)
            a = full_array(affine.a.compute(env) if affine.a is not None else 0.0, (T, B, n), dtype, xp)
            b = full_array(affine.b.compute(env) if affine.b is not None else 0.0, (T, B, n), dtype, xp)
            sequence = scan(a, b, initial, xp)
            previous = xp.concatenate([initial[None], sequence[:-1]])
            tape["scanned"][state] = (a, previous)
            env[state] = previous.reshape(rows, n)
            env[nexts[state]] = sequence.reshape(rows, n)
        evaluate(cell, post, env, lp, xp, products)
        tapes.append(tape)
        layer_in = env[nexts[cell.output]].reshape(T, B, -1)
    outputs = layer_in
    final_states = {s: xp.stack([t["env"][nexts[s]].reshape(T, B, -1)[-1] for t in tapes]) for s in cell.state_names}

    d_out = xp.zeros_like(outputs) if d_outputs is None else xp.asarray(d_outputs, dtype=dtype)
    param_grads, initial_grads = [None] * network.num_layers, {s: [None] * network.num_layers for s in cell.state_names}
    for layer in reversed(range(network.num_layers)):
        tape = tapes[layer]
        env, lp = tape["env"], tape["params"]
        adj: dict = {}
        add = _accumulator(adj)

        add(nexts[cell.output], d_out.reshape(rows, -1))
        for state in cell.state_names:
            given = (d_final_states or {}).get(state)
            if given is not None:
                last = xp.zeros((T, B, network.state_size(state)), dtype=dtype)
                last[-1] = xp.asarray(given, dtype=dtype)[layer]
                add(nexts[state], last.reshape(rows, -1))
        for name in reversed(post):                              # the values computed after the scan
            _backward_node(cell, name, adj.pop(name, None), env, add, products)
        for state, (a, previous) in tape["scanned"].items():
            n = network.state_size(state)
            direct = full_array(adj.pop(nexts[state], 0.0), (T, B, n), dtype, xp).copy()     # added to below
            read = adj.pop(state, None)                           # s[t-1] read after the scan, at step t
            d_initial = xp.zeros((B, n), dtype=dtype)
            if read is not None:
                read = full_array(read, (T, B, n), dtype, xp)
                direct[:-1] += read[1:]
                d_initial += read[0]
            shifted = xp.concatenate([a[1:], xp.zeros_like(a[:1])])          # a[t+1], 0 past the end
            g = scan(xp.ascontiguousarray(shifted[::-1]), xp.ascontiguousarray(direct[::-1]),
                     xp.zeros((B, n), dtype=dtype), xp)[::-1]
            d_initial += a[0] * g[0]
            initial_grads[state][layer] = d_initial
            affine = found.scanned[state]
            if affine.a is not None:
                affine.a.grad((g * previous).reshape(rows, n), env, add)
            if affine.b is not None:
                affine.b.grad(g.reshape(rows, n), env, add)
        for state in found.after:                                 # nothing reads them back: their initial value
            initial_grads[state][layer] = xp.zeros((B, network.state_size(state)), dtype=dtype)
        for name in reversed(free):
            node = cell[name]
            if node.is_leaf:
                continue
            _backward_node(cell, name, adj.pop(name, None), env, add, products)
        param_grads[layer] = {p.name: _reduce_to(adj[p.name], lp[p.name].shape, xp) if p.name in adj
                              else xp.zeros_like(lp[p.name]) for p in cell.params}
        inputs = [n.name for n in cell.nodes if n.op == "input"]
        d_in = sum((adj[i] for i in inputs if i in adj), xp.zeros((rows, tape["input"].shape[-1]), dtype=dtype))
        d_out = xp.asarray(d_in).reshape(T, B, -1)
    return Gradients(params=param_grads, x=d_out,
                     initial_states={s: xp.stack(v) for s, v in initial_grads.items()},
                     outputs=outputs, final_states=final_states)


def _accumulator(adj: dict):
    """add(name, term): the adjoint of `name` in `adj` grows by `term`."""
    def add(name, term):
        adj[name] = term if name not in adj else adj[name] + term
    return add


def _backward_node(cell, name: str, dy, env: dict, add, products: Products | None = None) -> None:
    """Push the adjoint dy of op node `name` to its arguments through the op's gradient rules (engine/ops.py); a
    matmul's operands rounded to products' mode first (engine/autodiff/step.py does the same step by step)."""
    if dy is None:
        return
    node = cell[name]
    spec = OPS[node.op]
    frame = {"dy": dy, "y": env[name], **{port: env.get(arg) for port, arg in zip(spec.ports, node.args)}}
    rounds = (products is not None and not products.strict and node.op == "matmul"
              and not fixed_weight(cell, node.args[0]))
    for arg, rule in zip(node.args, spec.vjp):
        if cell[arg].op == "const":
            continue
        if rule.passes_through:
            term = dy
        else:
            operands = [frame[a] for a in rule.args]
            if rounds:
                operands = [round_like(o, products.precision) for o in operands]
            term = apply_backward(rule.op, operands, node.attr_dict)
        add(arg, term)


# ---- the fast path on the GPU: generated kernels, one GEMM each way -------------------------------------------------

def fast_path_fits(cell) -> bool:
    """One scanned state, nothing computed after the scan, and every state-free matmul multiplies the layer input:
    then the forward is one GEMM, one generated kernel and the scan, and the backward one generated kernel
    (scan_backward_kernel.py) and two GEMMs."""
    found = analysis_or_refusal(cell)
    if len(found.scanned) != 1 or found.after:
        return False
    inputs = {n.name for n in cell.nodes if n.op == "input"}
    return all(cell[n].args[1] in inputs for n in found.free if cell[n].op == "matmul")


def fast_gradients(network, params, x, initial_states, d_outputs, d_final_states, dtype, xp,
                   mode: Products | None = None) -> Gradients:
    cell = network.cell
    mode = mode if mode is not None else Products("float32", xp)
    found = analysis_or_refusal(cell)
    (state,) = found.scanned
    n = network.state_size(state)
    T, B, _ = x.shape
    rows = T * B
    spec = scan_kernel.free_kernel_of(cell, (), np.dtype(dtype).name)
    scan = cuda_scan(dtype)
    layer_in = xp.asarray(x, dtype=dtype)
    tapes, lasts = [], []
    for layer in range(network.num_layers):
        lp = {k: xp.asarray(v, dtype=dtype) for k, v in params[layer].items()}
        env = {node.name: layer_in.reshape(rows, -1) for node in cell.nodes if node.op == "input"}
        blocks = grouped_matmuls(cell, found.free, env, lp, xp, products=mode)
        a, b = xp.empty((rows, n), dtype=dtype), xp.empty((rows, n), dtype=dtype)
        scan_kernel.compiled(spec)(*[env[i] if i in env else lp[i] for i in spec.inputs], a, b)
        a, b = a.reshape(T, B, n), b.reshape(T, B, n)
        initial = initial_state(initial_states, state, layer, (B, n), dtype, xp)
        sequence = scan(a, b, initial, xp)
        tapes.append((layer_in, lp, env, blocks, a, xp.concatenate([initial[None], sequence[:-1]])))
        lasts.append(sequence[-1])
        layer_in = sequence
    outputs = layer_in
    final_states = {state: xp.stack(lasts)}
    d_out = xp.zeros_like(outputs) if d_outputs is None else xp.asarray(d_outputs, dtype=dtype)
    param_grads, d_initial = [None] * network.num_layers, [None] * network.num_layers
    for layer in reversed(range(network.num_layers)):
        layer_input, lp, env, blocks, a, previous = tapes[layer]
        given = (d_final_states or {}).get(state)
        direct = xp.asarray(d_out, dtype=dtype)
        if given is not None:                      # a copy only where the final state's adjoint joins the last step
            direct = direct.copy()
            direct[-1] += xp.asarray(given, dtype=dtype)[layer]
        # g[t] = dL/ds[t] + a[t+1] g[t+1]: the reverse scan over the forward's own a, no reversed or shifted copy
        g = scan(a, direct, xp.zeros((B, n), dtype=dtype), xp, reverse=True, a_shift=1)
        d_initial[layer] = a[0] * g[0]
        layouts, pointers = kernel_inputs(spec.inputs, env, blocks, lp, n, xp)
        products, outs = {}, []                    # each input's adjoint: a GEMM output's in one buffer like it
        for name, pointer in zip(spec.inputs, pointers):
            if name in blocks:
                outs.append(products.setdefault(id(pointer), (pointer, xp.zeros_like(pointer)))[1])
            else:
                outs.append(xp.zeros_like(pointer) if name in env else xp.empty((rows, n), dtype=dtype))
        module = module_of(backward_source(cell, spec, state, layouts, np.dtype(dtype)), cell.name,
                           "scan_free_backward")
        kernel = module.get_function("scan_free_backward")
        threads = 256
        kernel((-(-rows * n // threads),), (threads,),
               (*pointers, xp.ascontiguousarray(g).reshape(rows, n), previous.reshape(rows, n), *outs,
                np.int64(rows), np.int64(n)))
        grads = {p.name: xp.zeros_like(lp[p.name]) for p in cell.params}
        d_in = xp.zeros((rows, layer_input.shape[-1]), dtype=dtype)
        for name, out in zip(spec.inputs, outs):
            if name in blocks:
                continue
            if name in env:
                d_in += out
            else:
                grads[name] += _reduce_to(out, lp[name].shape, xp)
        for operand, names in matmuls_by_operand(cell, frozenset(found.free)):
            product, gradient = products[id(blocks[names[0]][0])] if names[0] in blocks else (None, None)
            if gradient is None:
                continue
            weights = [cell[m].args[0] for m in names]
            fixed = [fixed_weight(cell, w) for w in weights]
            if mode.strict or not any(fixed):
                stacked = stacked_weights(lp, weights, xp)            # the forward's GEMM stacked them
                d_in += mode.matmul(gradient, stacked)
                d_stacked = mode.matmul(gradient.T, env[operand])
                offset = 0
                for w in weights:
                    grads[w] += d_stacked[offset:offset + lp[w].shape[0]]
                    offset += lp[w].shape[0]
            else:                  # a reduction's fixed matrix beside mode weights: each its own products
                offset = 0
                for w, is_fixed in zip(weights, fixed):
                    part = gradient[:, offset:offset + lp[w].shape[0]]
                    d_in += mode.matmul(part, lp[w], exact=is_fixed)
                    grads[w] += mode.matmul(part.T, env[operand], exact=is_fixed)
                    offset += lp[w].shape[0]
        param_grads[layer] = grads
        d_out = d_in.reshape(T, B, -1)
    return Gradients(params=param_grads, x=d_out, initial_states={state: xp.stack(d_initial)},
                     outputs=outputs, final_states=final_states)


# ---- the walks: the forward and the adjoint each one kernel a layer, beside the three GEMMs ----------------------

def walk_gradients(network, params, x, initial_states, d_outputs, d_final_states, dtype, xp, plan,
                   input_gradient: bool = True, products: Products | None = None) -> Gradients:
    """fast_gradients's result where the run walks (`plan` from scan.walk_plan): WalkTape's forward, then its
    backward."""
    return WalkTape(network, params, x, initial_states, dtype, xp, plan, products=products).backward(
        d_outputs, d_final_states, input_gradient)


def walk_record(network, params, x, initial_states: dict | None = None, dtype=np.float32, xp=None,
                precision: str = "float32"):
    """A WalkTape of the run where the network's cell walks on the GPU (its recurrence linear, its scan forming its
    coefficients from one GEMM of the layer input and parameters, the chains or the sequence short enough:
    scan.walk_plan), else None: how CellRNN and engine.train train such a cell as a scan. A cell of heads or
    reductions runs in its dense form, its gradients given back in the cell's own shapes. precision: the mode of
    both passes' GEMMs ("float32", "tf32", "float16", "bfloat16"; float32 arrays)."""
    precision = check_mode(check_training_precision("the scan's walks", precision), dtype, xp)
    source = network
    network, params = dense(network, params)
    plan = walk_plan(network, x, dtype, xp, precision)
    return None if plan is None else WalkTape(network, params, x, initial_states, dtype, xp, plan, source=source,
                                              products=Products(precision, xp))


class WalkTape:
    """The gradients' walks in the two halves a training step takes them, as engine.autodiff's Tape: the forward
    when made (`outputs`, `final_states`), backward(d_outputs, d_final_states) once, later.

    A layer's forward is its GEMM and scan_walk (the states and the final state); its backward is scan_walk_back
    (the GEMM output's adjoint, the parameter vectors' adjoints summed over the steps, the initial state's adjoint)
    and two GEMMs (the weights' gradient and the input's adjoint). The tape keeps each layer's input, GEMM output and
    states; at minGRU T = 4096, B = 8, H = 512 the fast path's forward also wrote a, b and a shifted copy of the
    states, and its backward ran a three-pass reverse scan and summed (rows, n) arrays for the biases."""

    def __init__(self, network, params, x, initial_states, dtype, xp, plan, source=None,
                 products: Products | None = None):
        cell = network.cell
        self.products = products = products if products is not None else Products("float32", xp)
        (state,) = plan.found.scanned
        n, L = network.state_size(state), network.num_layers
        T, B, _ = x.shape
        rows = T * B
        ((_, names),) = plan.groups
        self.network, self.plan, self.source, self.dtype, self.xp = network, plan, source, dtype, xp
        layer_in, self.layers = contiguous(x, dtype, xp), []
        for layer in range(L):
            lp = {k: as_dtype(v, dtype, xp) for k, v in params[layer].items()}
            weight = stacked_weights(lp, [cell[m].args[0] for m in names], xp)     # kept in lp for walk_inputs
            product = xp.empty((rows, weight.shape[0]), dtype=dtype)
            if np.dtype(dtype) == np.dtype(np.float32):     # issued first: the GPU multiplies while the host goes on
                products.project(layer_in.reshape(rows, -1), weight, out=product)
            else:
                xp.matmul(layer_in.reshape(rows, -1), weight.T, out=product)
            if layer == 0:
                given = (initial_states or {}).get(state)
                self.initial = (xp.zeros((L, B, n), dtype=dtype) if given is None
                                else contiguous(given, dtype, xp))
                finals = xp.empty((L, B, n), dtype=dtype)
            _, layouts, sources = walk_inputs(cell, plan, lp, n, xp)
            pointers = tuple(product if isinstance(v, int) else v for v in sources)
            module = module_of(walk_back_source(cell, plan.kernel, state, layouts, np.dtype(dtype)), cell.name,
                               "scan_walk_back")
            sequence = xp.empty((T, B, n), dtype=dtype)
            walk_launch(module.get_function("scan_walk"), pointers, self.initial[layer], sequence, finals[layer],
                        T, B, n)
            self.layers.append((layer_in, lp, weight, product, sources, pointers, module, sequence))
            layer_in = sequence
        self.outputs, self.final_states = layer_in, {state: finals}

    def backward(self, d_outputs=None, d_final_states: dict | None = None, input_gradient: bool = True) -> Gradients:
        """The gradients of every parameter, of x and of the initial states, given the outputs' adjoint (T, B, H)
        and the final states' ({name: (L, B, H)}; zeros where None). input_gradient=False: x's is not computed (one
        GEMM the size of the forward's fewer; gradients.x is None), as when x is data. Once: the tape's values are
        freed."""
        if self.layers is None:
            raise BackendError("this tape's backward pass has run already (it frees what it kept); hint: record the "
                               "forward again")
        cell, plan, xp, dtype = self.network.cell, self.plan, self.xp, self.dtype
        (state,) = plan.found.scanned
        ((_, names),) = plan.groups
        T, B, n = self.outputs.shape
        L, rows, chains = len(self.layers), T * B, B * n
        d_out = xp.zeros_like(self.outputs) if d_outputs is None else contiguous(d_outputs, dtype, xp)
        given_final = (d_final_states or {}).get(state)
        d_finals = (xp.zeros((L, B, n), dtype=dtype) if given_final is None
                    else contiguous(given_final, dtype, xp))
        param_grads, d_initial = [None] * L, xp.empty((L, B, n), dtype=dtype)
        covered = set(names) <= set(plan.kernel.inputs)      # the walk back writes every column of the GEMM output
        for layer in reversed(range(L)):
            layer_input, lp, weight, product, sources, pointers, module, sequence = self.layers[layer]
            q = xp.empty_like(product) if covered else xp.zeros_like(product)
            vectors = [name for name, v in zip(plan.kernel.inputs, sources) if not isinstance(v, int)]
            q_vec = xp.empty((max(len(vectors), 1), chains), dtype=dtype)
            module.get_function("scan_walk_back")(
                (-(-chains // 32),), (32 * BACK[0],),
                (*pointers, sequence, self.initial[layer], d_out, d_finals[layer], q, q_vec, d_initial[layer],
                 np.int32(T), np.int32(B), np.int64(n)))
            found: dict = {}               # each gradient as its term's own array (a weight used twice adds up)
            add = _accumulator(found)
            if vectors:                    # every vector's sum over the batch in one reduction
                summed = batch_sums(q_vec[:len(vectors)], B, n, xp)
            for m, name in enumerate(vectors):
                add(name, summed[m] if lp[name].shape == (n,) else _reduce_to(summed[m], lp[name].shape, xp))
            d_weight = self.products.matmul(q.T, layer_input.reshape(rows, -1))
            for w, offset in zip([cell[m].args[0] for m in names], group_offsets(cell, names, lp)):
                add(w, d_weight[offset:offset + lp[w].shape[0]])
            param_grads[layer] = {p.name: found[p.name] if p.name in found else xp.zeros_like(lp[p.name])
                                  for p in cell.params}
            d_out = self.products.matmul(q, weight).reshape(T, B, -1) if layer or input_gradient else None
        self.layers = None
        if self.source is not None:
            param_grads = compact_gradients(self.source, param_grads)
        return Gradients(params=param_grads, x=d_out, initial_states={state: d_initial}, outputs=self.outputs,
                         final_states=self.final_states)


BATCH_SUMS = r"""
extern "C" __global__ void batch_sums_{t}(const {t}* __restrict__ q, {t}* __restrict__ out, const int rows,
                                         const int B, const long n)
{{
    // out[r, j] = sum over b < B of q[r, b * n + j], in order of b: a thread per (r, j)
    const long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long)rows * n) return;
    const long r = e / n, j = e - r * n;
    const {t}* row = q + r * B * n + j;
    {t} acc = 0;
    for (int b = 0; b < B; ++b) acc += row[(long)b * n];
    out[e] = acc;
}}
"""


def batch_sums(q, B: int, n: int, xp):
    """(rows, B, n) -> (rows, n): each row's sum over the batch, one launch (q is (rows, B x n), C-contiguous). CuPy's
    sum(axis=1) took ~100 us of host time a training step of minGRU on an H200, in front of the weights' GEMM."""
    if xp is np:
        return q.reshape(q.shape[0], B, n).sum(axis=1)
    name = "double" if q.dtype == np.float64 else "float"
    kernel = module_of(BATCH_SUMS.format(t=name), "batch_sums", f"batch_sums_{name}").get_function(f"batch_sums_{name}")
    out = xp.empty((q.shape[0], n), dtype=q.dtype)
    total = q.shape[0] * n
    kernel((-(-total // 256),), (256,), (q, out, np.int32(q.shape[0]), np.int32(B), np.int64(n)))
    return out
