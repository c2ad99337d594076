"""The readout and the loss: a linear layer on the top layer's outputs at the steps the task reads, then mean
squared error or softmax cross-entropy, with the gradients the optimiser and bptt need.

    logits = h @ W_out.T + b_out            h: (S, B, H) outputs at the loss steps, logits: (S, B, O)
    mse:            loss = mean over S, B, O of (logits - y)^2;          metric = the same
    cross_entropy:  loss = mean over S, B of -log softmax(logits)[y];   metric = accuracy of argmax
    bce:            loss = mean over S, B of the sum over O of -log p(y_o), p = sigmoid(logits) (O independent
                    binary outputs, such as the keys of a piano-roll frame);  metric = the same (NLL per step)

All are means over the S * B read positions (over the positions the batch's mask counts, where it has one: whole
sequences padded at the end), so the loss (and a good learning rate) does not grow with the batch or with how many
steps are read.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.common import array_module_of
from .errors import TrainingError
from .tasks import Batch

LOSSES = ("mse", "cross_entropy", "bce")


def init_readout(output_size: int, hidden_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """W_out (O, H) and b_out (O,), uniform in +-1/sqrt(H) as torch.nn.Linear initialises them."""
    k = 1.0 / np.sqrt(hidden_size)
    return {"W_out": rng.uniform(-k, k, size=(output_size, hidden_size)),
            "b_out": rng.uniform(-k, k, size=(output_size,))}


@dataclass(frozen=True)
class LossResult:
    loss: float
    metric: float                       # mse, or accuracy in [0, 1]
    d_readout: dict[str, np.ndarray]    # dLoss/dW_out (O, H), dLoss/db_out (O,)
    d_outputs: np.ndarray               # (T, B, H) dLoss/d(top layer outputs): zero at steps the loss does not read


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(..., O) -> (..., O). Shifted by the row's max first, so exp never overflows and the largest term is 1."""
    xp = array_module_of(logits)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


def readout_loss(outputs: np.ndarray, readout: dict[str, np.ndarray], batch: Batch, loss: str) -> LossResult:
    """outputs: (T, B, H) the network's top layer. loss: "mse" or "cross_entropy"."""
    if loss not in LOSSES:
        raise TrainingError(f"unknown loss {loss!r}", hint="use one of " + ", ".join(LOSSES))
    xp = array_module_of(outputs)
    W_out, b_out = readout["W_out"], readout["b_out"]
    h = outputs[batch.loss_steps]                                       # (S, B, H)
    logits = h @ W_out.T + b_out                                        # (S, B, O)
    S, B, O = logits.shape
    # Each counted (step, row) position weighs 1 / count: a masked batch (whole sequences padded at the end) is the
    # mean over its sequences' own steps, as if no padding were there.
    weight = xp.ones((S, B), dtype=logits.dtype) if batch.mask is None else xp.asarray(batch.mask, dtype=logits.dtype)
    count = float(weight.sum())
    if count == 0:
        raise TrainingError("the batch's mask counts no loss step", hint="every sequence needs at least one step")
    if loss == "mse":
        error = logits - batch.targets                                  # (S, B, O)
        value = float((weight[..., None] * error ** 2).sum()) / (count * O)
        metric = value
        d_logits = 2.0 * weight[..., None] * error / (count * O)
    elif loss == "bce":
        targets = batch.targets                                         # (S, B, O) zeros and ones
        # -log sigmoid(z) for y = 1 and -log(1 - sigmoid(z)) for y = 0, as softplus(z) - y z written so that
        # exp never overflows: max(z, 0) - y z + log(1 + exp(-|z|)).
        nll = xp.maximum(logits, 0) - targets * logits + xp.log1p(xp.exp(-xp.abs(logits)))
        value = float((weight * nll.sum(axis=-1)).sum()) / count
        metric = value
        d_logits = weight[..., None] * (0.5 * (1.0 + xp.tanh(0.5 * logits)) - targets) / count   # sigmoid, no overflow
    else:
        targets = batch.targets                                         # (S, B) class ids
        rows, cols = xp.arange(S)[:, None], xp.arange(B)[None, :]
        log_p = log_softmax(logits)
        value = float(-(weight * log_p[rows, cols, targets]).sum()) / count
        metric = float((weight * (logits.argmax(axis=-1) == targets)).sum()) / count
        d_logits = xp.exp(log_p)                                        # softmax (S, B, O)
        d_logits[rows, cols, targets] -= 1.0
        d_logits *= weight[..., None] / count
    d_readout = {"W_out": xp.einsum("sbo,sbh->oh", d_logits, h), "b_out": d_logits.sum(axis=(0, 1))}
    d_outputs = xp.zeros_like(outputs)
    d_outputs[batch.loss_steps] = d_logits @ W_out                      # (S, B, H); loss steps are distinct
    return LossResult(value, metric, d_readout, d_outputs)
