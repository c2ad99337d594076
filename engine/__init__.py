"""RNN cell engine: define a recurrent cell from primitive ops, validate it, compile it, run it.

    import engine
    net = engine.Network(engine.preset("lstm").cell, input_size=64, hidden_size=256, num_layers=3)
    params = engine.init_params(net, seed=0)
    result = engine.run(net, params, x)          # x: (T, B, 64); result.outputs: (T, B, 256)
"""
from .api import bench, bptt, export_cuda, run
from .autodiff import Gradients, backward_graph
from .backends.common import RunResult
from .dsl import W, b, cell, const, hard_sigmoid, identity, relu, sigmoid, tanh, v
from .errors import BackendError, CellGraphError, CompileError, EngineError, FileError, Problem
from .explain import explain, explain_json, explain_text
from .gallery import Preset, TorchLayout, presets
from .gallery import get as preset
from .ir import CellGraph, Node, StateSpec
from .latex import to_latex
from .nets.data import Layers, Net, NetParams, Pool, init_net_params
from .nets.io import load_net, net_from_dict, net_from_json, net_to_dict, net_to_json
from .nets.presets import net_preset
from .nets.runner import prepare_net, run_net
from .network import Network
from .params import Params, init_params
from .serialize import from_dict, from_json, load, save, to_dict, to_json
from .study import load_study, resume_study, study
from .training import compare, tasks, train

__all__ = [
    "run", "bench", "export_cuda", "RunResult", "W", "b", "cell", "const", "hard_sigmoid", "identity", "relu", "sigmoid", "tanh", "v",
    "BackendError", "CellGraphError", "CompileError", "EngineError", "FileError", "Problem", "Preset", "TorchLayout",
    "presets", "preset", "CellGraph", "Node", "StateSpec", "to_latex", "Network", "Params", "init_params",
    "from_dict", "from_json", "load", "save", "to_dict", "to_json", "explain", "explain_json", "explain_text",
    "Layers", "Net", "NetParams", "Pool", "init_net_params", "load_net", "net_from_dict", "net_from_json",
    "net_preset", "net_to_dict", "net_to_json", "prepare_net", "run_net", "train", "compare", "tasks",
    "bptt", "backward_graph", "Gradients", "study", "resume_study", "load_study",
]
