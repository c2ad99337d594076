"""PyTorch running a cell graph with torch ops, one per IR op per step: what a researcher writes today.

The step is generated from the IR as straight-line Python, one statement per node with the graph's
names (an unrolled interpreter over cell.topo_order), plus the usual layer loop over time:

    def lstm_step(x, h, c, W_ii, b_ii, ...):
        W_ii_x = F.linear(x, W_ii)
        i_add_1 = (W_ii_x + b_ii)
        ...
        return h_next, c_next

    def lstm_layer(xs, h, c, W_ii, ...):
        outputs = []
        for t in range(xs.size(0)):
            h, c = lstm_step(xs[t], h, c, W_ii, ...)
            outputs.append(h)
        return torch.stack(outputs), h, c

Being source, it runs eagerly, under torch.compile (the step is compiled; the loop stays Python) and
under TorchScript (the whole layer is scripted), so the three are the same program. torch is
imported lazily: this module imports without it.
"""
from __future__ import annotations

import itertools
import keyword
import linecache
import re
import warnings

import numpy as np

from ..errors import BackendError
from ..flops import batched_nodes
from ..ir import CellGraph
from ..network import Network
from ..ops import OPS, apply_elementwise
from ..params import Params


def torch_expressions() -> dict[str, str]:
    """The torch spelling of each op that has one (OpDef.torch, over the op's port names). The meaning is
    engine/ops.py's NumPy definition; the CPU tests run every preset through these against the NumPy reference."""
    return {name: op.torch for name, op in OPS.items() if op.torch is not None}


MODES = ("eager", "compile", "script")
_RESERVED = {"torch", "F", "xs", "outputs", "t", "self"}
_counter = itertools.count()


def _identifier(text: str) -> str:
    text = re.sub(r"\W", "_", text)
    return text if text and not text[0].isdigit() else f"cell_{text}"


class _Names:
    """Python variable names for graph nodes: the node's own name unless it is a keyword or taken."""

    def __init__(self, reserved: set[str]):
        self.taken = set(reserved)
        self.names: dict[str, str] = {}

    def __call__(self, node: str) -> str:
        if node not in self.names:
            name = node
            while keyword.iskeyword(name) or name in self.taken:
                name += "_"
            self.taken.add(name)
            self.names[node] = name
        return self.names[node]


def function_names(cell: CellGraph) -> tuple[str, str]:
    base = _identifier(cell.name)
    return f"{base}_step", f"{base}_layer"


def torch_source(cell: CellGraph) -> str:
    """Python source of the step and layer functions of `cell` (see the module docstring)."""
    spellings = torch_expressions()
    for node in cell.nodes:
        if not node.is_leaf and node.op not in spellings:
            raise BackendError(f"node '{node.name}': op '{node.op}' has no torch spelling. hint: give its OpDef "
                               "in engine/ops.py a `torch` form")
    step_name, layer_name = function_names(cell)
    var = _Names(_RESERVED | {step_name, layer_name})
    states = [var(s) for s in cell.state_names]
    params = [var(p.name) for p in cell.params]
    x = var(cell.input.name)
    constants = {n.name: float(n.attr("value")) for n in cell.nodes if n.op == "const"}
    body = []
    for name in cell.topo_order:
        node = cell[name]
        if node.is_leaf:
            continue
        if node.op != "matmul" and all(a in constants for a in node.args):
            # Numbers only: fold to a number so that no torch function receives a Python float.
            constants[name] = float(apply_elementwise(node.op, [np.float64(constants[a]) for a in node.args],
                                                      node.attr_dict))
            continue
        args = [repr(constants[a]) if a in constants else var(a) for a in node.args]
        if node.op in ("max", "min"):           # torch.maximum/minimum take tensors only: a number as a full tensor
            tensor = next(var(a) for a in node.args if a not in constants)
            args = [f"torch.full_like({tensor}, {constants[a]!r})" if a in constants else var(a) for a in node.args]
        fields = dict(zip(OPS[node.op].ports, args))
        if node.attr("factor") is not None:
            fields["factor"] = repr(float(node.attr("factor")))
        heads = cell[node.args[0]].attr("heads", 1) if node.op == "matmul" else 1
        if heads > 1:      # a block-diagonal weight (heads, r, c): one batched product of the heads, (k, B, c) @ (k, c, r)
            operand = fields["operand"]
            body.append(f"    {var(name)} = torch.bmm({operand}.reshape({operand}.shape[0], {heads}, -1).transpose(0, 1), "
                        f"{fields['weight']}.transpose(1, 2)).transpose(0, 1).reshape({operand}.shape[0], -1)")
            continue
        body.append(f"    {var(name)} = {spellings[node.op].format(**fields)}")
    batched = batched_nodes(cell)
    results = []
    for s in cell.states:
        value = var(s.next)
        # A next value read from parameters only has no batch dimension yet.
        results.append(value if s.next in batched else f"{value}.expand_as({var(s.name)})")
    step_args = ", ".join([x, *states, *params])
    lines = [
        f"# Generated from cell '{cell.name}' (structure {cell.structural_hash}) by engine.bench.torch_cell:",
        "# one torch op per cell op per step, the way a custom RNN is written in PyTorch.",
        "import torch",
        "import torch.nn.functional as F",
        "",
        "",
        f"def {step_name}({step_args}):",
        *body,
        f"    return {', '.join(results)}",
        "",
        "",
        f"def {layer_name}(xs, {', '.join([*states, *params])}):",
        "    outputs = []",
        "    for t in range(xs.size(0)):",
        f"        {', '.join(states)} = {step_name}(xs[t], {', '.join([*states, *params])})",
        f"        outputs.append({var(cell.output)})",
        f"    return torch.stack(outputs), {', '.join(states)}",
        "",
    ]
    return "\n".join(lines)


def load_functions(cell: CellGraph) -> dict:
    """Execute the generated source in a fresh namespace and return it. The source is registered
    with linecache so that TorchScript and tracebacks can read it."""
    source = torch_source(cell)
    tag = next(_counter)
    filename = f"<engine.bench.torch_cell {cell.name} #{tag}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": f"engine_torch_cell_{_identifier(cell.name)}_{tag}"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def layer_function(cell: CellGraph, mode: str = "eager", compile_options: dict | None = None):
    """The layer function (xs, *states, *params) -> (outputs (T, B, H), *final states), in a mode:
    'eager', 'compile' (torch.compile of the step; compiles lazily at the first call) or 'script'."""
    import torch  # deferred: torch is optional (the cuDNN and torch baselines)
    if mode not in MODES:
        raise BackendError(f"argument 'mode' must be one of {', '.join(MODES)}, got {mode!r}")
    namespace = load_functions(cell)
    step_name, layer_name = function_names(cell)
    if mode == "compile":
        # The layer loop finds the step through its module globals: swap in the compiled one.
        namespace[step_name] = torch.compile(namespace[step_name], **(compile_options or {}))
    if mode == "script":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # torch.jit.script is deprecated in torch 2.x
            return torch.jit.script(namespace[layer_name])
    return namespace[layer_name]


def torch_params(network: Network, params: Params, device, dtype) -> list[list]:
    """Per layer, the parameter tensors in the step's argument order (cell.params)."""
    import torch  # deferred: torch is optional (the cuDNN and torch baselines)
    return [[torch.as_tensor(np.asarray(params[layer][p.name]), dtype=dtype, device=device)
             for p in network.cell.params] for layer in range(network.num_layers)]


def run_network(layer_fn, network: Network, layer_params: list[list], xs, initial_states: dict | None = None):
    """Layers in sequence. xs: (T, B, I) tensor; initial_states: name -> (L, B, H) tensor, zeros where
    not given. Returns (outputs (T, B, H), {state: (L, B, H)})."""
    import torch  # deferred: torch is optional (the cuDNN and torch baselines)
    cell = network.cell
    B = xs.shape[1]
    finals: dict[str, list] = {name: [] for name in cell.state_names}
    layer_in = xs
    for layer in range(network.num_layers):
        states = []
        for name in cell.state_names:
            if initial_states is not None and name in initial_states:
                states.append(initial_states[name][layer])
            else:
                states.append(torch.zeros(B, network.hidden_size, dtype=xs.dtype, device=xs.device))
        layer_out, *states = layer_fn(layer_in, *states, *layer_params[layer])
        for name, value in zip(cell.state_names, states):
            finals[name].append(value)
        layer_in = layer_out
    return layer_in, {name: torch.stack(values) for name, values in finals.items()}


def run_torch(network: Network, params: Params, x, initial_states: dict | None = None, *,
              device="cpu", dtype=None, mode: str = "eager"):
    """Convenience for tests: NumPy in, NumPy out. dtype defaults to torch.float64."""
    import torch  # deferred: torch is optional (the cuDNN and torch baselines)
    dtype = dtype or torch.float64
    xs = torch.as_tensor(np.asarray(x), dtype=dtype, device=device)
    states = None if initial_states is None else {
        k: torch.as_tensor(np.asarray(v), dtype=dtype, device=device) for k, v in initial_states.items()}
    layer_fn = layer_function(network.cell, mode)
    with torch.no_grad():
        out, finals = run_network(layer_fn, network, torch_params(network, params, device, dtype), xs, states)
    return out.cpu().numpy(), {k: v.cpu().numpy() for k, v in finals.items()}
