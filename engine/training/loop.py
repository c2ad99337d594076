"""The training loop: any cell, stacked into a network, a linear readout on top, trained with Adam by
backpropagation through time on a task's batches: on the CPU in float64 (device="cpu", the default), or on the GPU
in float32 (device="gpu": the fused training step of engine/autodiff/fused_tape.py, with the readout, the loss and Adam
in CuPy, so nothing leaves the GPU but the loss and the gradient norm a step).

    import engine
    result = engine.train(engine.preset("lstm").cell, "adding", hidden_size=16, steps=300, seed=0)
    result.final_metric, result.losses[-1], result.seconds

Training is a pure function of (cell, task, settings): the seed fixes the initial parameters
(engine.init_params(network, seed)), the readout, the training batches and the held-out set, each from its
own stream, so the same seed gives the same curves bit for bit (on the CPU; on one GPU, runs repeat too, but fp32
curves differ from float64 ones in the last digits) and cells compared with one seed see the same data.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from .. import backends
from ..arguments import shown
from ..autodiff import record
from ..autodiff.errors import AutodiffError
from ..autodiff.fused_planner import training_plan
from ..backends.common import array_module_of, check_precision
from ..backends.reference import run as reference_run
from ..codegen.precision import PRECISIONS
from ..errors import BackendError
from ..gallery import Preset
from ..gallery import get as get_preset
from ..ir import CellGraph
from ..network import Network
from ..params import Params, init_params
from ..schedules.scan_grad import walk_record
from ..serialize import to_dict
from .errors import TrainingError
from .loss import init_readout, readout_loss
from .optim import Adam, clip_by_global_norm, global_norm
from .results import TrainResult, environment
from .tasks import Batch, Task, get_task

Progress = Callable[[int, int, float], None]

# Random streams derived from (seed, use), one per use, so that changing one (say, the eval set's size) leaves
# the others as they were.
TRAIN_STREAM, EVAL_STREAM, READOUT_STREAM = 1, 2, 3

DEVICES = ("cpu", "gpu")

EXAMPLES = {"hidden_size": 32, "num_layers": 1, "steps": 200, "batch": 16, "seed": 0, "eval_every": 20,
            "eval_batch": 128}


def check_integer(name: str, value, lo: int, hint: str | None = None) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lo:
        raise TrainingError(f"{name} must be an integer of at least {lo}, got {value!r}",
                            hint=hint or f"for example {name}={EXAMPLES[name]}")


def build_network(cell_or_network, task: Task, hidden_size: int | None, num_layers: int) -> Network:
    """The network to train: the given one (its input size must be the task's), or the cell stacked
    num_layers deep with the task's input size."""
    if isinstance(cell_or_network, Network):
        network = cell_or_network
        if network.input_size != task.input_size:
            raise TrainingError(f"the network's input_size is {network.input_size}, but task '{task.name}' gives "
                                f"inputs of size {task.input_size}",
                                hint=f"build it with input_size={task.input_size}, or pass the cell and hidden_size")
        if hidden_size is not None and hidden_size != network.hidden_size:
            raise TrainingError(f"hidden_size={hidden_size} was given, but the network has hidden_size="
                                f"{network.hidden_size}", hint="leave hidden_size out when passing a Network")
        return network
    if isinstance(cell_or_network, str):
        cell_or_network = get_preset(cell_or_network)
    cell = cell_or_network.cell if isinstance(cell_or_network, Preset) else cell_or_network
    if not isinstance(cell, CellGraph):
        raise TrainingError(f"cannot train a {type(cell).__name__}",
                            hint="pass a CellGraph (engine.preset('lstm').cell, a @cell design, engine.load(path)), "
                                 "a preset name or an engine.Network")
    if hidden_size is None:
        raise TrainingError(f"hidden_size is needed to stack cell '{cell.name}' into a network",
                            hint="train(cell, task, hidden_size=32, ...)")
    check_integer("hidden_size", hidden_size, 1)
    check_integer("num_layers", num_layers, 1)
    if cell.input_is_hidden and hidden_size != task.input_size:
        raise TrainingError(f"cell '{cell.name}' needs input size == hidden size, and task '{task.name}' gives inputs "
                            f"of size {task.input_size}, not hidden_size={hidden_size}",
                            hint=f"hidden_size={task.input_size}, or a cell that projects its input with a weight")
    return Network(cell, task.input_size, hidden_size, num_layers)


def check_settings(task: Task, steps, batch, seq_len, lr, clip, seed, eval_every, eval_batch) -> None:
    check_integer("steps", steps, 1)
    check_integer("batch", batch, 1)
    check_integer("seq_len", seq_len, task.min_seq_len, hint=f"seq_len >= {task.min_seq_len} for task '{task.name}'")
    check_integer("seed", seed, 0)
    check_integer("eval_every", eval_every, 1)
    check_integer("eval_batch", eval_batch, 1)
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise TrainingError(f"lr must be a positive number, got {lr!r}", hint="try lr=0.01 (Adam)")
    if clip is not None and (not isinstance(clip, (int, float)) or isinstance(clip, bool) or not math.isfinite(clip)
                             or clip < 0):
        raise TrainingError(f"clip must be a non-negative number or None, got {clip!r}",
                            hint="clip=1.0 bounds each step's gradient norm; 0 or None turns clipping off")


def forward_tape(network: Network, params, x, dtype, backend: str, precision: str):
    """The forward pass of a training step, keeping what its backward reads: the scan's walks for a cell that walks
    on the GPU in float32, its GEMMs in the precision mode (scan_grad.walk_record: a linear recurrence, minGRU),
    else engine.autodiff's record."""
    if backend == "fused" and np.dtype(dtype) == np.dtype(np.float32):
        tape = walk_record(network, params, x, dtype=dtype, xp=array_module_of(x), precision=precision)
        if tape is not None:
            return tape
    return record(network, params, x, dtype=dtype, backend=backend, precision=precision)


def evaluate(network: Network, params, readout, batch: Batch, task: Task,
             precision: str = "float32") -> tuple[float, float]:
    """(loss, metric) on a batch, forward only (on the GPU, in float32, when the batch is there), its matmuls in
    the precision mode the model trains in."""
    if array_module_of(batch.x) is not np:       # on the GPU: the training step's forward (the tape is dropped)
        outputs = forward_tape(network, params, batch.x, np.float32, "fused", precision).outputs
    else:
        outputs = reference_run(network, params, batch.x, dtype=np.float64, precision=precision).outputs  # (T, B, H)
    scored = readout_loss(outputs, readout, batch, task.loss)
    return scored.loss, scored.metric


def mode_of(precision) -> str:
    """The precision mode's full name (backends.common.check_precision); TrainingError naming the argument for an
    unknown one."""
    try:
        return check_precision(precision)
    except BackendError:
        raise TrainingError(f"precision must be one of {', '.join(PRECISIONS)}, got {shown(precision)}",
                            hint="precision='float32' (strict, the default) or 'bfloat16' / 'float16' / 'tf32' "
                                 "(tensor-core matmuls, fp32 accumulation)") from None


def check_device(device, network: Network, precision: str = "float32") -> object:
    """NumPy for "cpu", CuPy for "gpu" (TrainingError saying why the GPU cannot train this network in this mode)."""
    if device not in DEVICES:
        raise TrainingError(f"device must be one of {', '.join(DEVICES)}, got {device!r}",
                            hint="device='cpu' (float64, the default) or device='gpu' (float32, the fused step)")
    if device == "cpu":
        return np
    ok, why = backends.gpu_status()
    if not ok:
        raise TrainingError(f"device='gpu' needs a CUDA GPU with CuPy: {why}", hint="device='cpu' trains on the CPU")
    try:
        training_plan(network.cell, precision=precision)
    except (AutodiffError, BackendError) as e:
        where = "on the GPU" if precision == "float32" else f"on the GPU in {precision}"
        raise TrainingError(f"cell '{network.cell.name}' cannot train {where}: {e}",
                            hint="device='cpu' trains it in float64" + (
                                "" if precision == "float32" else ", or precision='float32' on the GPU")) from None
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    return cupy


def to_device(batch: Batch, xp, dtype) -> Batch:
    """A batch's arrays as arrays of xp (its inputs and regression targets in dtype)."""
    if xp is np:
        return batch
    targets = batch.targets if batch.targets.dtype.kind in "iu" else batch.targets.astype(dtype)
    mask = None if batch.mask is None else xp.asarray(batch.mask, dtype=dtype)
    return Batch(xp.asarray(batch.x, dtype=dtype), xp.asarray(targets), xp.asarray(batch.loss_steps), mask)


def held_out_batch(task: Task, seed: int, eval_batch: int, seq_len: int, split: str = "eval") -> Batch:
    """The held-out set: a dataset's whole sequences of the split (JSB Chorales), else `eval_batch` sequences of
    `seq_len` steps drawn from the seed's evaluation stream."""
    if task.whole is not None:
        return task.whole(split)
    return task.batch(np.random.default_rng([seed, EVAL_STREAM]), eval_batch, seq_len, split=split)


def train(cell_or_network, task: str | Task, *, hidden_size: int | None = None, num_layers: int = 1,
          steps: int = 200, batch: int = 16, seq_len: int = 20, lr: float = 0.01, clip: float | None = 1.0,
          seed: int = 0, eval_every: int | None = None, eval_batch: int = 128,
          on_progress: Progress | None = None, device: str = "cpu", precision: str = "float32") -> TrainResult:
    """Train a cell (CellGraph, Preset or preset name; hidden_size and num_layers stack it) or a Network on a
    task (a name from engine.tasks() or a Task) for `steps` Adam steps on batches of `batch` sequences of
    `seq_len` steps, gradients clipped to global norm `clip` (None or 0: not clipped). Scores a held-out set of
    `eval_batch` sequences before training, every `eval_every` steps (default: a tenth of the run) and at the
    end; a task with a test split (JSB Chorales) is scored on it once, after training (result.test_metric).
    on_progress(step, steps, loss) is called after every step. device: "cpu" (float64) or "gpu" (float32, the
    fused training step); the result's params and readout are NumPy arrays either way. precision: the mode of the
    step's matmuls (engine/codegen/precision.py): "float32" (strict), or "tf32", "bfloat16", "float16" (operands
    rounded to the mode, fp32 accumulation and master weights; on the GPU the fused step's tensor-core GEMMs, on the
    CPU the reference's emulation of them).

    Raises TrainingError, naming the step, if the loss or the gradients stop being finite."""
    task = get_task(task)
    eval_every = max(1, steps // 10) if eval_every is None and isinstance(steps, int) else eval_every
    check_settings(task, steps, batch, seq_len, lr, clip, seed, eval_every, eval_batch)
    precision = mode_of(precision)
    network = build_network(cell_or_network, task, hidden_size, num_layers)
    xp = check_device(device, network, precision)
    dtype = np.float64 if xp is np else np.float32
    started = time.perf_counter()

    params = init_params(network, seed=seed)
    readout = init_readout(task.output_size, network.output_size, np.random.default_rng([seed, READOUT_STREAM]))
    if xp is not np:
        params = Params([{k: xp.asarray(v, dtype=dtype) for k, v in layer.items()} for layer in params.layers])
        readout = {k: xp.asarray(v, dtype=dtype) for k, v in readout.items()}
    train_rng = np.random.default_rng([seed, TRAIN_STREAM])
    held_out = to_device(held_out_batch(task, seed, eval_batch, seq_len), xp, dtype)
    backend = "reference" if xp is np else "fused"
    optimizer = Adam(lr=lr)

    losses: list[float] = []
    initial_loss, initial_metric = evaluate(network, params, readout, held_out, task, precision)
    eval_steps, eval_losses, eval_metrics = [0], [initial_loss], [initial_metric]
    # Overflow on the way to a divergence is expected: it is caught below and reported with its step, so
    # NumPy's warnings would only repeat it less clearly.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for step in range(1, steps + 1):
            data = to_device(task.batch(train_rng, batch, seq_len), xp, dtype)
            tape = forward_tape(network, params, data.x, dtype, backend, precision)   # one forward: loss, gradients
            scored = readout_loss(tape.outputs, readout, data, task.loss)
            if not math.isfinite(scored.loss):
                raise diverged(step, steps, "loss", scored.loss, lr, clip)
            grads = tape.backward(scored.d_outputs, input_gradient=False)      # x is data
            groups = [*grads.params, scored.d_readout]
            norm = global_norm(groups)
            if not math.isfinite(norm):
                raise diverged(step, steps, "gradient norm", norm, lr, clip)
            groups, _ = clip_by_global_norm(groups, clip)
            optimizer.step([*params.layers, readout], groups)
            losses.append(scored.loss)
            if step % eval_every == 0 or step == steps:
                loss, metric = evaluate(network, params, readout, held_out, task, precision)
                if not math.isfinite(loss):
                    raise diverged(step, steps, "held-out loss", loss, lr, clip)
                eval_steps.append(step)
                eval_losses.append(loss)
                eval_metrics.append(metric)
            if on_progress is not None:
                on_progress(step, steps, scored.loss)
    test_loss = test_metric = None
    if "test" in task.splits:                       # scored once, after training: the number a paper reports
        test_loss, test_metric = evaluate(network, params, readout,
                                          to_device(held_out_batch(task, seed, eval_batch, seq_len, "test"), xp, dtype),
                                          task, precision)
    seconds = time.perf_counter() - started
    settings = {"hidden_size": network.hidden_size, "num_layers": network.num_layers, "proj_size": network.proj_size,
                "input_size": network.input_size, "steps": steps, "batch": batch, "seq_len": seq_len, "lr": lr,
                "clip": clip, "seed": seed, "eval_every": eval_every, "eval_batch": eval_batch, "optimizer": "adam",
                "dtype": np.dtype(dtype).name, "device": device, "precision": precision}
    if xp is not np:                    # the trained values back on the host, as the CPU run gives them
        params = Params([{k: v.get().astype(np.float64) for k, v in layer.items()} for layer in params.layers])
        readout = {k: v.get().astype(np.float64) for k, v in readout.items()}
    return TrainResult(cell=network.cell.name, cell_hash=network.cell.structural_hash,
                       cell_json=to_dict(network.cell), task=task.name, metric=task.metric, baseline=task.baseline,
                       settings=settings, losses=losses, eval_steps=eval_steps, eval_losses=eval_losses,
                       eval_metrics=eval_metrics, seconds=seconds,
                       num_params=network.num_params() + sum(v.size for v in readout.values()),
                       environment=environment(), params=params, readout=readout, test_loss=test_loss,
                       test_metric=test_metric)


def diverged(step: int, steps: int, what: str, value: float, lr: float, clip: float | None) -> TrainingError:
    return TrainingError(f"training stopped at step {step} of {steps}: the {what} became {value}",
                         hint=f"lower the learning rate (lr={lr:g} now)"
                              + (f" or clip the gradients harder (clip={clip:g} now)" if clip
                                 else " or clip the gradients (clip=1.0)"),
                         step=step)


def compare(cells: list, task: str | Task, *, on_progress: Progress | None = None, **settings) -> list[TrainResult]:
    """Train several cells side by side with the same settings and seed, so each sees the same batches and the
    same held-out set; one result per cell, in order. on_progress(step, total, loss) counts over all of them
    (total = len(cells) * steps), one bar for the whole comparison."""
    if not cells:
        raise TrainingError("compare needs at least one cell", hint="compare(['lstm', 'gru'], 'adding', ...)")
    task = get_task(task)
    precision = mode_of(settings.get("precision", "float32"))
    for cell in cells:                  # refuse a cell the settings or device cannot take before training any
        network = build_network(cell, task, settings.get("hidden_size"), settings.get("num_layers", 1))
        check_device(settings.get("device", "cpu"), network, precision)
    results = []
    for index, cell in enumerate(cells):
        def progress(step, steps, loss, offset=index):
            on_progress(offset * steps + step, len(cells) * steps, loss)
        results.append(train(cell, task, on_progress=progress if on_progress else None, **settings))
    return results
