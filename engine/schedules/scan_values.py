"""The scan schedule's state-free values over the whole sequence: every value that reads no state, computed on
T x B rows at once (engine/schedules/scan.py's step 1), the input projections grouped into one GEMM an operand, in
the run's precision mode (engine/schedules/scan_modes.py); and the array helpers the scan's forward and its gradients
(engine/schedules/scan_grad.py) share."""
from __future__ import annotations

import functools

import numpy as np

from ..ir import CellGraph
from ..ops import apply_elementwise
from .project import project
from .scan_modes import Products, fixed_weight


def evaluate(cell: CellGraph, names, env: dict, layer_params: dict, xp, products: Products | None = None) -> None:
    """Compute the op nodes `names` (in topological order) into env, every value on all rows at once (the matmuls
    in products' precision mode; strict where None)."""
    for name in names:
        if name in env:
            continue
        node = cell[name]
        if node.is_param:
            env[name] = layer_params[name]
        elif node.op == "const":
            env[name] = node.attr("value")
        elif node.op == "matmul":
            weight, operand = env[node.args[0]], env[node.args[1]]
            env[name] = (operand @ weight.T if products is None or products.strict
                         else products.project(operand, weight, exact=fixed_weight(cell, node.args[0])))
        elif not node.is_leaf:
            env[name] = apply_elementwise(node.op, [env[a] for a in node.args], node.attr_dict)


def grouped_matmuls(cell: CellGraph, free, env: dict, layer_params: dict, xp, groups=None,
                    products: Products | None = None) -> dict:
    """The state-free matmuls, one GEMM per operand: the weights that multiply the same value stacked, its
    result's column blocks (strided views) the matmuls' values. minGRU's W_z x and W_h x are one GEMM. products:
    the precision mode's (strict where None); a reduction's fixed matrix stacked beside mode weights has its
    columns multiplied again, strictly. Returns {matmul: (the GEMM's whole output, its column offset)}."""
    blocks = {}
    for operand, names in groups if groups is not None else matmuls_by_operand(cell, frozenset(free)):
        if operand not in env:
            evaluate(cell, [n for n in cell.topo_order if n in free and n != operand and n in _upstream(cell, operand)]
                     + [operand], env, layer_params, xp, products)
        weights = [layer_params[cell[n].args[0]] for n in names]
        stacked = stacked_weights(layer_params, [cell[n].args[0] for n in names], xp)
        fixed = [fixed_weight(cell, cell[n].args[0]) for n in names]
        if products is not None and not products.strict:
            product = products.project(env[operand], stacked, exact=all(fixed))
            if any(fixed) and not all(fixed):
                offset = 0
                for weight, is_fixed in zip(weights, fixed):
                    if is_fixed:
                        product[:, offset:offset + weight.shape[0]] = env[operand] @ weight.T
                    offset += weight.shape[0]
        elif xp is np or stacked.dtype != np.float32:
            product = env[operand] @ stacked.T
        else:                   # through cublasLt (engine/schedules/cublaslt.py: faster than cupy.matmul here)
            product = xp.empty((env[operand].shape[0], stacked.shape[0]), dtype=stacked.dtype)
            project(xp, xp.ascontiguousarray(env[operand]), stacked, None, product, "float32")
        offset = 0
        for name, weight in zip(names, weights):
            env[name] = product[:, offset:offset + weight.shape[0]]
            blocks[name] = (product, offset)
            offset += weight.shape[0]
    return blocks


def stacked_weights(layer_params: dict, names: list[str], xp):
    """The weights `names` stacked by rows, for one GEMM; kept with the parameters under "W_a+W_b" (a program's
    are uploaded once, so they are stacked once)."""
    if len(names) == 1:
        return layer_params[names[0]]
    key = "+".join(names)
    if key not in layer_params:
        layer_params[key] = stack_rows([layer_params[w] for w in names], xp)
    return layer_params[key]


def stack_rows(arrays: list, xp):
    """xp.concatenate(arrays) (by rows); on the GPU, for C-contiguous arrays of one dtype, one device-to-device copy
    an array into a new buffer: cupy.concatenate spent 41 us of host time stacking minGRU's two (512, 512) weights
    on an H200, in front of a training step's first GEMM, against ~15."""
    first = arrays[0]
    if xp is np or any(a.dtype != first.dtype or a.shape[1:] != first.shape[1:] or not a.flags.c_contiguous
                       for a in arrays):
        return xp.concatenate(arrays)
    out = xp.empty((sum(a.shape[0] for a in arrays), *first.shape[1:]), dtype=first.dtype)
    stream, offset = xp.cuda.get_current_stream().ptr, 0
    for a in arrays:
        xp.cuda.runtime.memcpyAsync(out.data.ptr + offset, a.data.ptr, a.nbytes,
                                    xp.cuda.runtime.memcpyDeviceToDevice, stream)
        offset += a.nbytes
    return out


def contiguous(value, dtype, xp):
    """value as a C-contiguous array of xp in dtype, not copied where it is one already (as_dtype)."""
    array = as_dtype(value, dtype, xp)
    return array if array.flags.c_contiguous else xp.ascontiguousarray(array)


def as_dtype(value, dtype, xp):
    """xp.asarray(value, dtype): the array itself where it is already one of xp's in that dtype (cupy.asarray took
    ~20 us of host time a parameter on an H200 even then, and a training step's walk converts every parameter)."""
    if isinstance(value, xp.ndarray) and value.dtype == dtype:
        return value
    return xp.asarray(value, dtype=dtype)


@functools.lru_cache(maxsize=64)
def matmuls_by_operand(cell: CellGraph, free: frozenset) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The state-free matmuls grouped by the value they multiply, in the order the cell computes them."""
    by_operand: dict[str, list[str]] = {}
    for name in cell.topo_order:
        if name in free and cell[name].op == "matmul":
            by_operand.setdefault(cell[name].args[1], []).append(name)
    return tuple((operand, tuple(names)) for operand, names in by_operand.items())


def _upstream(cell: CellGraph, name: str) -> set[str]:
    found, stack = set(), [name]
    while stack:
        n = stack.pop()
        if n not in found:
            found.add(n)
            stack.extend(cell[n].args)
    return found


def initial_state(initial_states, state, layer, shape, dtype, xp):
    if initial_states is not None and state in initial_states:
        return xp.ascontiguousarray(xp.asarray(initial_states[state], dtype=dtype)[layer])
    return xp.zeros(shape, dtype=dtype)


def full_array(value, shape, dtype, xp):
    """`value` (a number, a (rows, n) or (n,) array) as a contiguous array of `shape` (steps, batch, n) or (rows, n)."""
    array = xp.asarray(value, dtype=dtype)
    if array.ndim == 2 and len(shape) == 3:
        array = array.reshape(shape)
    return xp.ascontiguousarray(xp.broadcast_to(array, shape))
