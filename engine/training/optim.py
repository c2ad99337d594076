"""Adam and gradient clipping by global norm, over nested parameters: a list of groups, each a dict name ->
array (the network's layers, then the readout), NumPy or CuPy. No randomness: the same gradients give the same
updates bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..backends.common import array_module_of

Groups = list[dict[str, np.ndarray]]


def global_norm(grads: Groups) -> float:
    """The L2 norm of every gradient taken together, as one vector (summed where the arrays are, NumPy or CuPy,
    and read once)."""
    total = sum((g * g).sum() for group in grads for g in group.values())
    return math.sqrt(float(total))


def clip_by_global_norm(grads: Groups, max_norm: float | None) -> tuple[Groups, float]:
    """(grads scaled so their global norm is at most max_norm, the norm before clipping). Scaling all of them by
    one factor keeps the update's direction (Pascanu, Mikolov & Bengio 2013). max_norm None or 0: no clipping."""
    norm = global_norm(grads)
    if not max_norm or norm <= max_norm:
        return grads, norm
    scale = max_norm / norm
    return [{name: g * scale for name, g in group.items()} for group in grads], norm


@dataclass
class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1) with the paper's defaults and bias correction:

        m <- beta1 m + (1 - beta1) g;   v <- beta2 v + (1 - beta2) g^2
        theta <- theta - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
    """

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: Groups = field(default_factory=list)
    v: Groups = field(default_factory=list)

    def step(self, params: Groups, grads: Groups) -> None:
        """Update params in place (the arrays keep their identity, so Params objects holding them see it)."""
        if not self.m:
            self.m = [{name: array_module_of(p).zeros_like(p) for name, p in group.items()} for group in params]
            self.v = [{name: array_module_of(p).zeros_like(p) for name, p in group.items()} for group in params]
        self.t += 1
        correction1 = 1.0 - self.beta1 ** self.t
        correction2 = 1.0 - self.beta2 ** self.t
        for group, grad_group, m_group, v_group in zip(params, grads, self.m, self.v):
            for name, p in group.items():
                g = grad_group[name]
                m, v = m_group[name], v_group[name]
                m *= self.beta1
                m += (1.0 - self.beta1) * g
                v *= self.beta2
                v += (1.0 - self.beta2) * g * g
                p -= self.lr * (m / correction1) / ((v / correction2) ** 0.5 + self.eps)
