"""Benchmark configurations: input size I, hidden size H, layers L, steps T, batch B.

The anchor configurations have fixed names so that results from different runs and machines can be
compared. Any other configuration is given as "I,H,L,T,B" or in a JSON file (benchmarks/configs/). A net
configuration (NET_ANCHORS, e.g. `deepspeech`) runs a preset network of blocks instead (engine/bench/nets.py).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import BackendError
from ..nets.presets import net_preset
from ..network import Network

FIELDS = ("input_size", "hidden_size", "num_layers", "steps", "batch")
LIMIT = 1 << 20   # the same sanity limit as engine.network


@dataclass(frozen=True)
class BenchConfig:
    name: str
    input_size: int     # I
    hidden_size: int    # H
    num_layers: int     # L
    steps: int          # T
    batch: int          # B

    def __post_init__(self):
        for key in FIELDS:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= LIMIT:
                raise BackendError(f"benchmark config '{self.name}': {key} must be an integer in 1..{LIMIT}, "
                                   f"got {value!r}")

    @property
    def label(self) -> str:
        """e.g. 'mid (I=512 H=512 L=4 T=100 B=64)'."""
        return f"{self.name} ({self.shape})"

    @property
    def shape(self) -> str:
        return (f"I={self.input_size} H={self.hidden_size} L={self.num_layers} T={self.steps} "
                f"B={self.batch}")

    @property
    def wavefront_steps(self) -> int:
        """Dependency diagonals of the layer x time grid: L + T - 1 (see engine.schedule)."""
        return self.num_layers + self.steps - 1

    def network(self, cell) -> Network:
        return Network(cell, self.input_size, self.hidden_size, self.num_layers)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict, where: str = "config") -> "BenchConfig":
        if not isinstance(data, dict):
            raise BackendError(f"{where}: expected an object with {', '.join(FIELDS)}, got {data!r}; hint: or an "
                               "anchor name")
        missing = [k for k in FIELDS if k not in data]
        if missing:
            raise BackendError(f"{where}: missing field(s) {', '.join(missing)}; hint: give all of {', '.join(FIELDS)}")
        unknown = sorted(set(data) - set(FIELDS) - {"name"})
        if unknown:
            raise BackendError(f"{where}: unknown field(s) {', '.join(unknown)}; hint: fields are name, "
                               + ", ".join(FIELDS))
        values = {k: data[k] for k in FIELDS}
        name = data.get("name") or _shape_name(*values.values())
        return BenchConfig(name=str(name), **values)


ANCHORS: dict[str, BenchConfig] = {c.name: c for c in [
    BenchConfig("blogB", 64, 256, 3, 100, 64),
    BenchConfig("mid", 512, 512, 4, 100, 64),
    BenchConfig("lat", 512, 512, 2, 100, 1),
    BenchConfig("large", 1024, 1024, 2, 100, 128),
    BenchConfig("blogA", 2560, 2560, 1, 200, 64),
]}


@dataclass(frozen=True)
class NetBenchConfig:
    """A preset network of engine/nets/presets.py at fixed sizes (engine/bench/nets.py): `layers` layers a block of
    layers, each --preset giving their cell."""

    name: str
    net: str            # engine.nets.presets.NET_PRESETS
    input_size: int     # I
    hidden_size: int    # H
    layers: int         # layers a block of layers
    steps: int          # T
    batch: int          # B

    @property
    def label(self) -> str:
        return f"{self.name} ({self.shape})"

    @property
    def shape(self) -> str:
        return (f"network, {self.layers} layers a block: I={self.input_size} H={self.hidden_size} T={self.steps} "
                f"B={self.batch}")

    def build(self, cell):
        return net_preset(self.net, input_size=self.input_size, hidden_size=self.hidden_size, layers=self.layers,
                          cell=cell)

    def to_dict(self) -> dict:
        return asdict(self)


# The seed benchmark's DeepSpeech block (issue #11): 4 layers, max-pool over time by 2, 4 more; I = H = 512.
NET_ANCHORS: dict[str, NetBenchConfig] = {c.name: c for c in [
    NetBenchConfig("deepspeech", "deepspeech", 512, 512, 4, 100, 64),
]}


def _shape_name(I, H, L, T, B) -> str:
    return f"I{I}-H{H}-L{L}-T{T}-B{B}"


def parse_config(text: str) -> list[BenchConfig]:
    """One --config value: an anchor name, 'I,H,L,T,B', or a path to a JSON file."""
    text = str(text).strip()
    if text in ANCHORS:
        return [ANCHORS[text]]
    if text in NET_ANCHORS:
        return [NET_ANCHORS[text]]
    if text.endswith(".json"):
        return load_config_file(text)
    parts = [p.strip() for p in text.split(",")]
    if len(parts) == 5:
        try:
            I, H, L, T, B = (int(p) for p in parts)
        except ValueError:
            raise BackendError(f"--config '{text}': I,H,L,T,B must be five integers. "
                               "hint: e.g. --config 512,512,2,100,64") from None
        return [BenchConfig(_shape_name(I, H, L, T, B), I, H, L, T, B)]
    raise BackendError(f"--config '{text}' is not an anchor name, 'I,H,L,T,B' or a .json file. "
                       f"hint: anchors are {', '.join(ANCHORS)}; networks: {', '.join(NET_ANCHORS)}")


def load_config_file(path: str | Path) -> list[BenchConfig]:
    """A JSON file: {"configs": [...]} or a list; each entry an anchor name or an object with
    name (optional), input_size, hidden_size, num_layers, steps, batch."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BackendError(f"config file {path} does not exist. hint: see benchmarks/configs/") from None
    except json.JSONDecodeError as e:
        raise BackendError(f"config file {path}: invalid JSON at line {e.lineno}: {e.msg}; hint: see "
                           "benchmarks/configs/") from None
    entries = data.get("configs") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise BackendError(f"config file {path}: expected a non-empty list under \"configs\"; hint: see "
                           "benchmarks/configs/")
    configs = []
    for k, entry in enumerate(entries):
        where = f"config file {path}, configs[{k}]"
        if isinstance(entry, str):
            if entry not in ANCHORS:
                raise BackendError(f"{where}: '{entry}' is not an anchor. hint: anchors are {', '.join(ANCHORS)}")
            configs.append(ANCHORS[entry])
        else:
            configs.append(BenchConfig.from_dict(entry, where))
    return configs


def parse_configs(values: list[str] | None) -> list[BenchConfig | NetBenchConfig]:
    """Every --config value in order, duplicates removed; all (cell) anchors when none is given."""
    if not values:
        return list(ANCHORS.values())
    seen: dict[BenchConfig, None] = {}
    for value in values:
        for config in parse_config(value):
            seen.setdefault(config, None)
    return list(seen)
