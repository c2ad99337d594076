"""What running a net returns."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class NetResult:
    outputs: np.ndarray                 # (T_out, B, output size)
    block_outputs: list = field(default_factory=list)   # what each block produced (None: a block inside a run that
                                                        # fuse_pools made one program, whose output never existed)
    lengths: np.ndarray | None = None   # (B,) each sequence's steps in `outputs`, where the run was given lengths
