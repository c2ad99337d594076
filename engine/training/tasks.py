"""Sequence tasks to train any cell on: the registry and the generators. The project generates the synthetic ones
itself; "chars" reads a text that ships with it and "jsb" the Bach chorales of music21's corpus (engine/training/jsb.py).

Every task draws its batches from a numpy Generator, so a batch is a pure function of the generator's state
(same seed, same data). A batch says which steps the loss reads (`loss_steps`): the last one (adding problem,
parity at the end), every one (running parity, character-level language modelling) or the last few (copy).

    import numpy as np
    from engine.training.tasks import get_task
    task = get_task("adding")
    batch = task.batch(np.random.default_rng(0), batch_size=16, seq_len=20)
    batch.x.shape, batch.targets.shape, batch.loss_steps      # (20, 16, 2), (1, 16, 1), [19]
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from ..gallery import closest_names
from . import jsb
from .errors import TrainingError

DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "lamplighter.txt"
COPY_SYMBOLS = 8            # data symbols of the copy task (Arjovsky et al. 2016 use 8)
EVAL_FRACTION = 0.1         # the end of the corpus held out for evaluation


@dataclass(frozen=True)
class Batch:
    x: np.ndarray               # (T, B, I) float64
    targets: np.ndarray         # (S, B) int64 class ids, or (S, B, O) float64 values: one row per loss step
    loss_steps: np.ndarray      # (S,) increasing step indices whose outputs the loss reads
    mask: np.ndarray | None = None   # (S, B) 1 where a row's loss step counts, 0 past its sequence's end (None: all)


@dataclass(frozen=True)
class Task:
    name: str
    input_size: int
    output_size: int            # classes (cross-entropy), keys (bce), or 1 (regression)
    loss: str                   # "mse", "cross_entropy" or "bce" (engine/training/loss.py)
    metric: str                 # "mse" or "nll" (lower is better), or "accuracy" (higher is better)
    reads: str                  # which steps the loss reads, in words
    description: str
    citation: str
    baseline_of: Callable[[], float]   # the metric of the best predictor that ignores the input (the bar to beat)
    min_seq_len: int
    make: Callable[[np.random.Generator, int, int, str], Batch]   # (rng, batch_size, seq_len, split) -> Batch
    splits: tuple[str, ...] = ("train", "eval")
    data_ready: Callable[[], bool] = lambda: True   # False while the data is not built (its first use builds it)
    whole: Callable[[str], Batch] | None = None     # split -> every sequence of it whole (a dataset's held-out set)

    @property
    def higher_is_better(self) -> bool:
        return self.metric == "accuracy"

    @property
    def baseline(self) -> float:
        """The input-blind metric (a data task's first use builds its data to compute it)."""
        return self.baseline_of()

    def batch(self, rng: np.random.Generator, batch_size: int, seq_len: int, split: str = "train") -> Batch:
        """A batch of `batch_size` sequences of `seq_len` steps. split: "train" or "eval" (held-out data where the
        task has it: the corpus's last tenth, JSB Chorales' valid split; the synthetic tasks draw fresh sequences
        either way), or "test" for JSB Chorales."""
        for field, value, lo in (("batch", batch_size, 1), ("seq_len", seq_len, self.min_seq_len)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lo:
                raise TrainingError(f"task '{self.name}': {field} must be an integer of at least {lo}, got {value!r}",
                                    hint=f"{self.name} needs seq_len >= {self.min_seq_len}" if field == "seq_len"
                                    else "use a batch of 1 or more sequences")
        if split not in self.splits:
            raise TrainingError(f"task '{self.name}' has no split {split!r}",
                                hint="use one of " + ", ".join(repr(s) for s in self.splits))
        return self.make(rng, int(batch_size), int(seq_len), split)


def one_hot(ids: np.ndarray, size: int) -> np.ndarray:
    """ids: (T, B) ints -> (T, B, size) float64."""
    return np.eye(size)[ids]


def adding_batch(rng: np.random.Generator, B: int, T: int, split: str) -> Batch:
    # Channel 0: values U(0, 1); channel 1: two markers, one in each half, so the first value must be held at
    # least until the middle of the sequence.
    values = rng.random((T, B))                                          # (T, B)
    first = rng.integers(0, T // 2, size=B)                            # (B,)  T >= 2: both halves non-empty
    second = rng.integers(T // 2, T, size=B)                           # (B,)
    markers = np.zeros((T, B))
    columns = np.arange(B)
    markers[first, columns] = 1.0
    markers[second, columns] = 1.0
    target = values[first, columns] + values[second, columns]           # (B,)
    x = np.stack([values, markers], axis=-1)                            # (T, B, 2)
    return Batch(x, target.reshape(1, B, 1), np.array([T - 1]))


def copy_length(T: int) -> int:
    """How many symbols the copy task asks to remember in T steps: T // 5, at least 1 (T = 20: 4 symbols, a
    delay of 11 steps, the go marker, 4 steps of output)."""
    return max(1, T // 5)


def copy_batch(rng: np.random.Generator, B: int, T: int, split: str) -> Batch:
    # Inputs are one-hot over K data symbols, a blank (K) and the go marker (K + 1): n symbols, blanks for the
    # delay, the marker, then n blank steps during which the network must emit the n symbols in order.
    K, n = COPY_SYMBOLS, copy_length(T)
    symbols = rng.integers(0, K, size=(n, B))                           # (n, B)
    ids = np.full((T, B), K)
    ids[:n] = symbols
    ids[T - n - 1] = K + 1
    return Batch(one_hot(ids, K + 2), symbols, np.arange(T - n, T))


def parity_bits(rng: np.random.Generator, B: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    bits = rng.integers(0, 2, size=(T, B))                              # (T, B)
    return bits[..., None].astype(np.float64), np.cumsum(bits, axis=0) % 2


def parity_batch(rng: np.random.Generator, B: int, T: int, split: str) -> Batch:
    x, running = parity_bits(rng, B, T)
    return Batch(x, running, np.arange(T))


def parity_end_batch(rng: np.random.Generator, B: int, T: int, split: str) -> Batch:
    x, running = parity_bits(rng, B, T)
    return Batch(x, running[-1:], np.array([T - 1]))


@lru_cache(maxsize=1)
def corpus() -> tuple[str, str]:
    """The corpus text and its vocabulary (its distinct characters, sorted)."""
    text = CORPUS.read_text(encoding="ascii")
    return text, "".join(sorted(set(text)))


@lru_cache(maxsize=1)
def corpus_ids() -> tuple[np.ndarray, np.ndarray]:
    """(train ids, eval ids): the corpus as vocabulary indices, its last EVAL_FRACTION held out."""
    text, vocab = corpus()
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in text], dtype=np.int64)
    cut = int(len(ids) * (1 - EVAL_FRACTION))
    return ids[:cut], ids[cut:]


def chars_batch(rng: np.random.Generator, B: int, T: int, split: str) -> Batch:
    train_ids, eval_ids = corpus_ids()
    ids = train_ids if split == "train" else eval_ids
    if T + 1 > len(ids):
        raise TrainingError(f"task 'chars': seq_len={T} is longer than the {split} text ({len(ids) - 1} steps)",
                            hint=f"use seq_len <= {len(eval_ids) - 1}")
    starts = rng.integers(0, len(ids) - T, size=B)                     # (B,)
    windows = ids[starts[None, :] + np.arange(T + 1)[:, None]]          # (T + 1, B)
    return Batch(one_hot(windows[:-1], len(corpus()[1])), windows[1:], np.arange(T))


@lru_cache(maxsize=1)
def most_common_fraction() -> float:
    """The accuracy of always predicting the corpus's commonest character (on the held-out text)."""
    _, eval_ids = corpus_ids()
    return float(np.bincount(eval_ids).max() / len(eval_ids))


JSB_SPLITS = {"train": "train", "eval": "valid", "test": "test"}   # a task's split -> the dataset's


def jsb_batch(rng: np.random.Generator, B: int, T: int, split: str) -> Batch:
    """B windows of T + 1 frames from the split's chorales (a chorale drawn by how many windows it holds, so every
    window is equally likely): the input is frame t, the target frame t + 1, at every step."""
    rolls = jsb.chorales().rolls_of(JSB_SPLITS[split])
    starts = np.array([max(0, len(roll) - T) for roll in rolls])              # windows of T + 1 frames a chorale
    if starts.sum() == 0:
        longest = max(len(roll) for roll in rolls)
        raise TrainingError(f"task 'jsb': seq_len={T} is longer than every {JSB_SPLITS[split]} chorale (the longest "
                            f"has {longest} frames, {longest - 1} steps of next-frame prediction)",
                            hint=f"use seq_len <= {longest - 1}")
    which = rng.choice(len(rolls), size=B, p=starts / starts.sum())           # (B,)
    x = np.empty((T, B, jsb.KEYS))
    targets = np.empty((T, B, jsb.KEYS))
    for b, index in enumerate(which):
        start = rng.integers(0, starts[index])
        window = rolls[index][start:start + T + 1]                              # (T + 1, 88) bool
        x[:, b], targets[:, b] = window[:-1], window[1:]
    return Batch(x, targets, np.arange(T))


def jsb_whole(split: str) -> Batch:
    """Every chorale of the split whole, in one batch padded at the end to the longest: the input is frame t, the
    target frame t + 1, and the mask counts each chorale's own steps only. An RNN's output at t reads no later
    input, so the padding changes no counted output: the metric is the split's NLL per step over whole sequences,
    as Boulanger-Lewandowski et al. (2012) report it."""
    rolls = jsb.chorales().rolls_of(JSB_SPLITS[split])
    T, B = max(len(roll) for roll in rolls) - 1, len(rolls)
    frames = np.zeros((T + 1, B, jsb.KEYS))
    mask = np.zeros((T, B))
    for b, roll in enumerate(rolls):
        frames[:len(roll), b] = roll
        mask[:len(roll) - 1, b] = 1.0
    return Batch(frames[:-1], frames[1:], np.arange(T), mask)


def jsb_baseline() -> float:
    data = jsb.chorales()                      # cached; the baseline itself takes milliseconds
    return jsb.marginal_nll(data.rolls_of("train"), data.rolls_of("valid"))


@lru_cache(maxsize=1)
def _registry() -> dict[str, Task]:
    vocab_size = len(corpus()[1])
    table = [
        Task("adding", 2, 1, "mse", "mse", "the last step",
             "two channels: values U(0, 1) and markers on two steps (one in each half); predict the sum of the "
             "two marked values at the end",
             "Hochreiter & Schmidhuber 1997, Long Short-Term Memory (the adding problem, experiment 4)",
             # Predicting the mean sum 1 leaves the variance of a sum of two independent U(0, 1): 2 / 12.
             baseline_of=lambda: 1 / 6, min_seq_len=2, make=adding_batch),
        Task("copy", COPY_SYMBOLS + 2, COPY_SYMBOLS, "cross_entropy", "accuracy", "the last T // 5 steps",
             f"memorise T // 5 symbols (of {COPY_SYMBOLS}), wait, and after the go marker reproduce them in order",
             "Hochreiter & Schmidhuber 1997; Arjovsky, Shah & Bengio 2016, Unitary Evolution RNNs (copying memory)",
             baseline_of=lambda: 1 / COPY_SYMBOLS, min_seq_len=3, make=copy_batch),
        Task("parity", 1, 2, "cross_entropy", "accuracy", "every step",
             "bits in (0 or 1), one a step; predict the parity of the bits so far at every step",
             "Minsky & Papert 1969; Hochreiter & Schmidhuber 1997 (parity as a long-range task)",
             baseline_of=lambda: 0.5, min_seq_len=1, make=parity_batch),
        Task("parity-end", 1, 2, "cross_entropy", "accuracy", "the last step",
             "bits in (0 or 1), one a step; predict the parity of all the bits at the end (harder: one "
             "signal a sequence)",
             "Minsky & Papert 1969; Hochreiter & Schmidhuber 1997 (parity as a long-range task)",
             baseline_of=lambda: 0.5, min_seq_len=1, make=parity_end_batch),
        Task("chars", vocab_size, vocab_size, "cross_entropy", "accuracy", "every step",
             f"character-level language modelling on {CORPUS.name} ({vocab_size} characters, one-hot): predict "
             "the next character at every step; evaluated on the held-out last tenth",
             "Elman 1990, Finding Structure in Time; Karpathy 2015, char-rnn",
             baseline_of=most_common_fraction, min_seq_len=1, make=chars_batch),
        Task("jsb", jsb.KEYS, jsb.KEYS, "bce", "nll", "every step",
             "JSB Chorales: Bach's four-voice chorales from music21's corpus as 88-key piano rolls, a frame an eighth "
             "note; predict which keys sound in the next frame, at every step (training on windows of seq_len "
             "frames); NLL per step in nats, evaluated on the valid split's whole chorales",
             "Allan & Williams 2005 (the JSB Chorales); Boulanger-Lewandowski, Bengio & Vincent 2012 (NLL per time "
             "step); Greff et al. 2017, LSTM: A Search Space Odyssey",
             baseline_of=jsb_baseline, min_seq_len=1, make=jsb_batch, splits=("train", "eval", "test"),
             data_ready=jsb.is_cached, whole=jsb_whole),
    ]
    return {task.name: task for task in table}


def tasks() -> list[str]:
    """The names of the tasks, in registry order (get_task(name) has the rest)."""
    return list(_registry())


def get_task(task: str | Task) -> Task:
    """A task by name (or the Task itself)."""
    if isinstance(task, Task):
        return task
    table = _registry()
    if task not in table:
        raise TrainingError(f"unknown task {task!r}",
                            hint=closest_names(task, table) + "known tasks: " + ", ".join(table))
    return table[task]
