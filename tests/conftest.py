"""Shared helpers for the CPU test suite.

Presets carry their own test inputs (Preset.test_sizes); `make_case` turns a preset into a network,
seeded parameters, a fresh random input and random initial states, so that every test runs the same
way on every preset. Helpers are handed out as fixtures (not imported from this file), so that
several conftest.py files can coexist under tests/.
"""
from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass

import numpy as np
import pytest

import engine
from engine.errors import CompileError
from engine.export import cublas_location

# BLAS libraries read their thread count when they load, in each xdist worker after this. One worker a core
# (pytest.ini: -n auto) with a BLAS thread a core each oversubscribes the host: 16 workers x 16 OpenBLAS threads on
# a 16-core GPU machine, whose tests compute float64 references. A value the caller set is kept.
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config):
    """Before xdist starts its workers (pytest_sessionstart): one BLAS thread each where the run has workers."""
    if getattr(config.option, "numprocesses", None):
        for name in BLAS_THREADS:
            os.environ.setdefault(name, "1")


@dataclass
class Case:
    preset: engine.Preset
    network: engine.Network
    params: engine.Params
    x: np.ndarray                                   # (T, B, I)
    initial_states: dict[str, np.ndarray] | None     # name -> (L, B, H)


def _make_case(preset: engine.Preset, num_layers: int = 2, seed: int = 0, initial_states: bool = True,
              steps: int | None = None) -> Case:
    sizes = preset.test_sizes
    network = engine.Network(preset.cell, input_size=sizes["input_size"], hidden_size=sizes["hidden_size"],
                             num_layers=num_layers)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(1000 + seed)
    T, B = steps or sizes["steps"], sizes["batch"]
    x = rng.standard_normal((T, B, sizes["input_size"]))
    states = None
    if initial_states:
        states = {name: rng.uniform(-0.8, 0.8, (num_layers, B, sizes["hidden_size"]))
                  for name in preset.cell.state_names}
    return Case(preset, network, params, x, states)


def _run_reference(case: Case, dtype=np.float64, **changes) -> engine.RunResult:
    fields = dict(params=case.params, x=case.x, initial_states=case.initial_states)
    fields.update(changes)
    return engine.run(case.network, fields["params"], fields["x"], fields["initial_states"], backend="reference",
                      dtype=dtype)


def _preset_dict(name: str = "lstm") -> dict:
    """A fresh, freely editable JSON dict of a valid preset (to build bad graphs from)."""
    return copy.deepcopy(engine.to_dict(engine.preset(name).cell))


@pytest.fixture
def make_case():
    """make_case(preset, num_layers=2, seed=0, initial_states=True, steps=None) -> Case."""
    return _make_case


@pytest.fixture
def run_reference():
    """run_reference(case, dtype=np.float64, **overrides) -> RunResult on the NumPy reference."""
    return _run_reference


@pytest.fixture
def preset_dict():
    """preset_dict(name='lstm') -> a fresh JSON dict of a valid preset, to edit into a bad one."""
    return _preset_dict


@pytest.fixture(scope="session")
def nvcc_include_flags():
    """The -I flag for cuBLAS's headers that nvcc needs to compile an exported program (none where the CUDA toolkit
    has them); skips without nvcc or without the headers."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    try:
        include, _ = cublas_location()
    except CompileError as e:
        pytest.skip(f"cuBLAS headers not found: {e}")
    return [f"-I{include}"] if include else []


# ---- JSB Chorales ----------------------------------------------------------------------------------------------------

JSB_SUBSET_SCORES = 20      # the first scores of music21's Bach corpus: about 16 four-voice chorales in all three splits


@pytest.fixture(scope="session", autouse=True)
def jsb_cache_of_the_session(tmp_path_factory):
    """The JSB Chorales cache of this test process, never the user's: a file in a temporary folder (the CLI's
    subprocesses inherit it)."""
    path = tmp_path_factory.mktemp("jsb") / "jsb_chorales.npz"
    before = os.environ.get("CELLFORGE_JSB_CACHE")
    os.environ["CELLFORGE_JSB_CACHE"] = str(path)
    yield path
    if before is None:
        os.environ.pop("CELLFORGE_JSB_CACHE", None)
    else:
        os.environ["CELLFORGE_JSB_CACHE"] = before


@pytest.fixture(scope="session")
def jsb_subset(jsb_cache_of_the_session):
    """Task 'jsb' on the chorales of the first JSB_SUBSET_SCORES scores of the corpus (seconds to parse, where the
    whole corpus takes about 20 s on two cores), written where the session's cache is."""
    from engine.training import jsb
    data = jsb.build(jsb.corpus_scores()[:JSB_SUBSET_SCORES], workers=1)
    jsb.save(data, jsb_cache_of_the_session)
    jsb.chorales.cache_clear()
    return data
