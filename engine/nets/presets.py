"""Preset networks: the seed benchmark's DeepSpeech block and a deep stack of one cell."""
from __future__ import annotations

from ..arguments import shown
from ..errors import BackendError
from ..gallery import closest_names
from .data import Layers, Net, Pool


def deepspeech(input_size: int = 512, hidden_size: int = 512, layers: int = 4, cell="lstm") -> Net:
    """The seed benchmark's DeepSpeech-style block: `layers` LSTM layers, max-pool over time by 2 (stride 2), `layers`
    more LSTM layers (4, 512 and 512 by default)."""
    first = Layers(cell, hidden_size, layers, name="rnn_a")
    return Net(input_size, (first, Pool("max", 2, 2, name="pool"), Layers(cell, hidden_size, layers, name="rnn_b")),
               name="deepspeech", doc=f"{layers} {first.cell.name} layers, max-pool over time by 2 (stride 2), "
                                      f"{layers} more (the seed benchmark's DeepSpeech block)")


def stack(input_size: int = 1024, hidden_size: int = 1024, layers: int = 16, cell="lstm") -> Net:
    """A deep stack of one cell: `layers` layers (16 LSTM layers of 1024 by default, issue #11's two-GPU case)."""
    block = Layers(cell, hidden_size, layers, name="stack")
    return Net(input_size, (block,), name="stack", doc=f"{layers} {block.cell.name} layers of {hidden_size}")


NET_PRESETS = {"deepspeech": deepspeech, "stack": stack}


def net_preset(name: str, **sizes) -> Net:
    if not isinstance(name, str) or name not in NET_PRESETS:
        raise BackendError(f"unknown network preset {shown(name)}; hint: {closest_names(name, NET_PRESETS)}known: "
                           + ", ".join(NET_PRESETS))
    return NET_PRESETS[name](**sizes)
