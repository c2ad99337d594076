"""Cells whose every name a generator turns into C is a reserved one (engine/c_names.py): C, C++ and CUDA keywords,
the toolchain headers' macros, the generated code's own names, spellings C++ reserves, names outside ASCII. Shared by
tests/test_generated_names.py (render, nvcc) and tests/gpu/test_generated_names_gpu.py (run)."""
from __future__ import annotations

import engine
from engine.c_names import GENERATED_NAMES, KEYWORDS, header_macros, helper_names

SPELLINGS = ("__LINE__", "__FILE__", "__CUDA_ARCH__", "_Bool", "_X", "_x", "x_", "a__b", "NULL__", "π", "état",
             "_1", "ª")


def reserved_list() -> list[str]:
    """Every reserved name that is a valid node name, in a fixed order."""
    names = sorted(KEYWORDS | GENERATED_NAMES | header_macros() | helper_names()) + list(SPELLINGS)
    return [n for n in dict.fromkeys(names) if n.isidentifier()]


def named_cell(names: list[str], cell_name: str = "NULL") -> engine.CellGraph:
    """An LSTM whose input, states, weights, biases and gates carry names[0..], then a chain of ops over the rest of
    `names` (alternating tanh and a sum with a parameter vector, also named from the list) feeding the new h."""
    it = iter(names)
    d = engine.to_dict(engine.preset("lstm").cell)
    rename = {old: next(it) for old in ("x", "h", "c", "W_ii", "b_ii", "W_hf", "b_hf", "i", "f", "g", "o", "i_pre",
                                        "c_next", "h_next_tanh")}
    for node in d["nodes"]:
        node["name"] = rename.get(node["name"], node["name"])
        node["args"] = [rename.get(a, a) for a in node.get("args", [])]
    d["states"] = [{"name": rename.get(s["name"], s["name"]), "next": rename.get(s["next"], s["next"])}
                   for s in d["states"]]
    d["output"] = rename["h"]
    # the chain: previous value -> tanh -> + vector -> tanh -> ... ; the last one is the new h
    d["nodes"] = [n if n["name"] != "h_next" else {**n, "name": "h_next0"} for n in d["nodes"]]
    prev, rest = "h_next0", list(it)
    for k, name in enumerate(rest):
        if k % 3 == 1:
            d["nodes"].append({"name": name, "op": "vector", "attrs": {"dim": "H"}})
            continue
        if k % 3 == 2:
            d["nodes"].append({"name": name, "op": "add", "args": [rest[k - 1], prev]})
        else:
            d["nodes"].append({"name": name, "op": "tanh", "args": [prev]})
        prev = name
    d["nodes"].append({"name": "h_next", "op": "identity", "args": [prev]})
    d["name"] = cell_name
    return engine.from_dict(d)
