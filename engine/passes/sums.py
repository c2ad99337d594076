"""Pass flatten_sums: find the add-trees that GEMMs can absorb and view each as one n-ary sum."""
from __future__ import annotations

import dataclasses

from .lowering import Lowering, Sum


def flatten_sums(low: Lowering) -> tuple[Lowering, str]:
    """A GEMM can absorb matmuls and biases only where it sees the whole sum they are added into."""
    cell = low.cell
    state_next = {s.next for s in cell.states}
    consumers = {n.name: cell.consumers(n.name) for n in cell.nodes}

    def internal(name: str) -> bool:
        # An add used only by one parent add, once, is part of the parent's tree. Read twice (a + a), it stays
        # a value of its own: flattened, a chain of n such doublings would be a sum of 2^n summands.
        node = cell[name]
        users = consumers[name]
        return (node.op == "add" and name not in state_next and len(users) == 1 and cell[users[0]].op == "add"
                and cell[users[0]].args.count(name) == 1)

    sums = []
    for name in cell.topo_order:
        node = cell[name]
        if node.op != "add" or internal(name):
            continue
        summands: list[str] = []
        absorbed: list[str] = [name]
        absorbed_set = {name}
        stack = list(reversed(node.args))
        while stack:
            arg = stack.pop()
            if internal(arg):
                if arg not in absorbed_set:
                    absorbed.append(arg)
                    absorbed_set.add(arg)
                stack.extend(reversed(cell[arg].args))
            else:
                summands.append(arg)
        matmuls = tuple(a for a in summands if cell[a].op == "matmul" and a not in state_next
                        and set(consumers[a]) <= absorbed_set)
        if matmuls:   # add-trees without matmuls stay plain adds (one statement per op)
            sums.append(Sum(name, tuple(summands), matmuls, tuple(absorbed)))
    if not sums:
        return low, "no sum contains a matmul"
    summary = "; ".join(f"{s.root} = " + " + ".join(s.summands) for s in sums)
    return dataclasses.replace(low, sums=tuple(sums)), summary
