"""Training any cell on sequence tasks the project generates itself (CPU, float64): tasks, the readout and loss,
Adam with clipping, the loop, and its results.

    import engine
    result = engine.train("lstm", "adding", hidden_size=16, steps=300, seq_len=10, seed=0)
    results = engine.compare(["lstm", "gru"], "parity", hidden_size=8, steps=200, seq_len=8)
"""
from .errors import TrainingError
from .loop import compare, train
from .results import TrainResult, load_results, save_results
from .tasks import Batch, Task, get_task, tasks

# engine.training.tasks is the function (the task names), as engine.tasks is; it hides the module of the same name
# from attribute access, so import from the module by its path: from engine.training.tasks import get_task.
__all__ = ["TrainingError", "train", "compare", "TrainResult", "load_results", "save_results", "Batch", "Task",
           "get_task", "tasks"]
