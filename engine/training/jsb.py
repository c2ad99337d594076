"""JSB Chorales: J. S. Bach's four-voice chorales as piano rolls, for polyphonic music modelling (issue #35).

The data is built from the Bach chorales that ship inside music21's corpus (a pip package), so nothing is downloaded:
every score of music21's `bach` corpus with exactly four parts (soprano, alto, tenor, bass) is sampled on a grid of
eighth notes into an 88-key piano roll (MIDI 21, A0, to 108, C8): frame k is the set of keys sounding at
k eighth notes from the start. A note that starts and ends between two grid points (a sixteenth off the beat) is
not sampled, as in the usual piano-roll form of the dataset (Allan & Williams 2005; Boulanger-Lewandowski, Bengio &
Vincent 2012, who use quarter notes). Repeats are not expanded.

The split is fixed: the scores sorted by their path in music21's corpus, the i-th going to train when i % 5 is 0, 1
or 2, to valid when it is 3 and to test when it is 4 (about 60/20/20, every part of the catalogue in each).

Parsing takes a few minutes on one core, so the first use parses the scores on every core and caches the rolls in
one file (cache_file(): $CELLFORGE_JSB_CACHE, else jsb_chorales.npz in $CELLFORGE_CACHE_DIR or ~/.cache/cellforge);
a cache of another format or music21 version, or one that cannot be read, is built again; where music21 is not
installed, a readable cache of this format is used as it is.

    from engine.training.jsb import chorales
    data = chorales()
    data.rolls_of("train")[0].shape          # (steps, 88) bool
"""
from __future__ import annotations

import io
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..files import DAMAGED_ARCHIVE, cache_root, write_with
from .errors import TrainingError

KEYS = 88                   # the piano's keys
LOWEST = 21                 # MIDI number of the lowest key, A0
STEP = 0.5                  # quarter lengths a frame: an eighth note
VOICES = 4
SPLITS = ("train", "valid", "test")
FORMAT = 1                  # bump when the roll or the split changes: a cache of another format is built again
CACHE_NAME = "jsb_chorales.npz"


def split_of(index: int) -> str:
    """The split of the index-th score in corpus-path order: 3 of 5 train, 1 valid, 1 test."""
    place = index % 5
    return "train" if place < 3 else "valid" if place == 3 else "test"


@dataclass(frozen=True)
class Chorales:
    names: tuple[str, ...]              # corpus paths (relative to music21's corpus folder), sorted
    rolls: tuple[np.ndarray, ...]       # one (steps, 88) bool piano roll per chorale
    splits: tuple[str, ...]             # "train", "valid" or "test" per chorale
    music21_version: str

    def rolls_of(self, split: str) -> list[np.ndarray]:
        if split not in SPLITS:
            raise TrainingError(f"JSB Chorales has no split {split!r}", hint="use one of " + ", ".join(SPLITS))
        return [roll for roll, s in zip(self.rolls, self.splits) if s == split]


def music21_or_error():
    try:
        import music21  # deferred: only the JSB task needs it
    except ImportError:
        raise TrainingError("the JSB Chorales task needs music21 (its corpus holds the chorales)",
                            hint="pip install -r requirements.txt (it names music21)") from None
    return music21


def corpus_scores() -> list[tuple[str, Path]]:
    """(name, path) of every score file in music21's Bach corpus, sorted by name (the path inside the corpus)."""
    music21 = music21_or_error()
    root = Path(music21.__file__).resolve().parent / "corpus"
    paths = [Path(p) for p in music21.corpus.getComposer("bach") if Path(p).suffix in (".mxl", ".xml", ".musicxml")]
    return sorted(((p.resolve().relative_to(root).as_posix(), p) for p in paths), key=lambda item: item[0])


def piano_roll(score) -> np.ndarray | None:
    """A music21 score -> its (steps, 88) bool roll on the eighth-note grid, or None unless it has four parts."""
    if len(score.parts) != VOICES:
        return None
    steps = math.ceil(float(score.highestTime) / STEP - 1e-9)
    roll = np.zeros((steps, KEYS), dtype=bool)
    for part in score.parts:
        for note in part.flatten().notes:                     # notes and chords, at offsets from the score's start
            start = float(note.offset)
            end = start + float(note.quarterLength)
            first, stop = math.ceil(start / STEP - 1e-9), math.ceil(end / STEP - 1e-9)   # frames k*STEP in [start, end)
            for pitch in note.pitches:
                key = pitch.midi - LOWEST
                if 0 <= key < KEYS:
                    roll[first:stop, key] = True
    return roll


def roll_of_file(path: str) -> np.ndarray | None:
    """Parse one score file (a worker's job) -> its roll, or None (not four parts)."""
    music21 = music21_or_error()
    try:
        score = music21.converter.parse(path)
    except Exception as e:          # music21 raises its own exception types from many places
        raise TrainingError(f"music21 cannot read the score {path!r}: {type(e).__name__}: {e}",
                            hint="reinstall music21 (pip install -r requirements.txt); its corpus ships the chorales") \
            from None
    return piano_roll(score)


def build(scores: list[tuple[str, Path]], workers: int | None = None) -> Chorales:
    """Parse `scores` (corpus_scores() or a part of it) on `workers` processes into a Chorales; the split is each
    score's place in `scores`, which must be in corpus-path order."""
    music21 = music21_or_error()
    workers = workers or os.cpu_count() or 1
    paths = [str(path) for _, path in scores]
    if workers > 1 and len(paths) > 1:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            rolls = list(pool.map(roll_of_file, paths, chunksize=8))
    else:
        rolls = [roll_of_file(p) for p in paths]
    kept = [(name, roll, split_of(i)) for i, ((name, _), roll) in enumerate(zip(scores, rolls)) if roll is not None]
    if not kept:
        raise TrainingError("none of the scores given has four parts", hint="build JSB Chorales from corpus_scores()")
    names, rolls, splits = zip(*kept)
    return Chorales(tuple(names), tuple(rolls), tuple(splits), str(music21.__version__))


def cache_file() -> Path:
    """$CELLFORGE_JSB_CACHE (a file), else jsb_chorales.npz in $CELLFORGE_CACHE_DIR, else in ~/.cache/cellforge."""
    if os.environ.get("CELLFORGE_JSB_CACHE"):
        return Path(os.environ["CELLFORGE_JSB_CACHE"])
    return cache_root() / CACHE_NAME


def save(data: Chorales, path: Path) -> None:
    """The rolls in one .npz: packed bits, the lengths, the names, the splits, the format and music21's version."""
    lengths = np.array([len(roll) for roll in data.rolls], dtype=np.int64)
    packed = np.packbits(np.concatenate(data.rolls), axis=1)                 # (frames, 11) uint8

    def write(f):
        np.savez_compressed(f, format=np.int64(FORMAT), music21_version=np.str_(data.music21_version),
                            names=np.array(data.names), splits=np.array(data.splits), lengths=lengths, packed=packed)
    write_with(path, write, "the JSB Chorales cache")


def load(path: Path) -> Chorales | None:
    """The cached Chorales, or None where the file is missing, unreadable, of another format, or of another music21
    than the one installed."""
    try:
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as f:
            if int(f["format"]) != FORMAT:
                return None
            version = str(f["music21_version"])
            lengths, names, splits = f["lengths"], [str(n) for n in f["names"]], [str(s) for s in f["splits"]]
            frames = np.unpackbits(f["packed"], axis=1, count=KEYS).astype(bool)
    except (*DAMAGED_ARCHIVE, KeyError):     # a damaged cache is rebuilt
        return None
    if len(lengths) != len(names) or len(names) != len(splits) or int(lengths.sum()) != len(frames) \
            or not set(splits) <= set(SPLITS):
        return None
    installed = installed_music21_version()
    if installed is not None and version != installed:
        return None
    rolls = tuple(np.split(frames, np.cumsum(lengths)[:-1]))
    return Chorales(tuple(names), rolls, tuple(splits), version)


def installed_music21_version() -> str | None:
    """music21's version, or None where it is not installed: a cache is then used as it is (it was built by some
    music21; one that can rebuild it decides whether it is current)."""
    try:
        import music21  # deferred: only the JSB task needs it
    except ImportError:
        return None
    return str(music21.__version__)


def is_cached() -> bool:
    return cache_file().is_file()


@lru_cache(maxsize=1)
def chorales() -> Chorales:
    """JSB Chorales from the cache, built (and cached) from music21's corpus on first use."""
    path = cache_file()
    data = load(path) if path.is_file() else None
    if data is None:
        data = build(corpus_scores())
        save(data, path)
    return data


def marginal_nll(train: list[np.ndarray], held_out: list[np.ndarray]) -> float:
    """The NLL per frame (nats, summed over the 88 keys) of `held_out`'s frames under independent keys with the
    training frequencies (smoothed by one frame on and one off): the best predictor that ignores the music so far."""
    frames = np.concatenate(train)
    p = (frames.sum(axis=0) + 1.0) / (len(frames) + 2.0)                     # (88,)
    target = np.concatenate(held_out).astype(np.float64)                      # (F, 88)
    return float(-(target * np.log(p) + (1 - target) * np.log1p(-p)).sum(axis=1).mean())
