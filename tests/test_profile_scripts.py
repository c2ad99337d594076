"""benchmarks/profile_run.py and profile_fused.py on the CPU (the GPU machine runs them under ncu): the case both
profile is the configuration named, with NumPy standing in for CuPy, and profile_fused's --option values parse as
Python literals where they are one."""
from __future__ import annotations

import numpy as np
from script_loader import load_script

from engine.bench.configs import parse_configs


def test_the_case_is_the_named_configuration():
    network, params, x = load_script("profile_run").case(np, "gru", "lat", seed=1)
    cfg = parse_configs(["lat"])[0]
    assert (network.input_size, network.hidden_size, network.num_layers) == (cfg.input_size, cfg.hidden_size,
                                                                             cfg.num_layers)
    assert x.shape == (cfg.steps, cfg.batch, cfg.input_size) and x.dtype == np.float32 and len(params.layers) == cfg.num_layers


def test_options_parse_as_literals_where_they_are_one():
    option = load_script("profile_fused").option
    assert option("step_product=cublaslt") == ("step_product", "cublaslt")
    assert option("x3_chunk=256") == ("x3_chunk", 256) and option("x3_chunk=None") == ("x3_chunk", None)
    assert option("x3_splitk=False") == ("x3_splitk", False)
