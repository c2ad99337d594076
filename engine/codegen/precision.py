"""Number formats: what a precision mode rounds, how weights are stored, and which product the kernels use.

Every mode keeps the cell math, the states and the outputs in float32; they differ in the matmuls:

    float32   strict IEEE fp32: FFMA products, subnormals kept (the engine compiles with NVRTC itself, without the
              -ftz=true CuPy adds: engine/codegen/nvrtc.py); the default; the reference's float64 is the yardstick
    tf32      operands rounded to TF32 (10-bit mantissa, round to nearest, ties away from zero) as they
              enter a tensor-core MMA, fp32 accumulation (as cuBLAS and cuDNN do with TF32 allowed)
    float16   weights stored in IEEE half, activations rounded to half (nearest even) as they enter the
              MMA, fp32 accumulation
    bfloat16  the same with bfloat16 (8-bit exponent, 7-bit mantissa)
    float32x3 fp32 accuracy on TF32 tensor cores (CUTLASS's 3xTF32): weights stored unrounded in fp32, and each
              operand v split into hi = tf32(v) and lo = tf32(v - hi) as it enters the MMA; the product is
              a_hi*b_lo + a_lo*b_hi + a_hi*b_hi (three TF32 MMAs, small products first, fp32 accumulation). The
              a_lo*b_lo term it drops is below 2^-22 of the product. Opt-in: engine.run(precision="float32x3"),
              or backend="auto" with allow_tensor_core_fp32=True for precision="float32". Where the schedules
              take the warp GEMV of few batch rows (B <= 4) it computes strict fp32 FFMA products instead (more
              accurate than the split; no tensor cores there to save time on)

So "every operand of every matmul is rounded to the mode's format, products are summed in fp32" is the
whole definition of the reduced modes (float32x3: "each operand is split into two TF32 parts, three of their
four products summed in fp32"); engine.rounding emulates it in NumPy, and the reference backend runs with it
(`reference.run(..., precision="bfloat16")`) to check the GPU kernels tightly.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError


@dataclass(frozen=True)
class Precision:
    name: str
    storage: str              # C type of the elementwise kernels' buffers
    compute: str              # C type of registers
    literal_suffix: str       # "1.0f"
    numpy_dtype: str
    short: str = "fp32"       # the benchmark harness's name: fp32, tf32, fp16, bf16
    mode: int = 0             # kernels/tile_gemm.cuh RNN_FP32 / RNN_TF32 / RNN_FP16 / RNN_BF16 / RNN_TF32X3
    weight_type: str = "float"   # C type of packed GEMM weights
    weight_bytes: int = 4
    k_step: int = 0           # K of one tensor-core MMA (8 for tf32 and float32x3, 16 for 16-bit), 0: FFMA
    doc: str = ""

    def load(self, expr: str) -> str:
        return expr if self.storage == self.compute else f"({self.compute})({expr})"

    def store(self, expr: str) -> str:
        return expr if self.storage == self.compute else f"({self.storage})({expr})"

    @property
    def tensor_cores(self) -> bool:
        return self.k_step > 0

    @property
    def split(self) -> bool:
        """Whether each operand enters the MMA as two TF32 parts (float32x3) rather than rounded once."""
        return self.name == "float32x3"

    @property
    def fp32_accurate(self) -> bool:
        """Whether the mode's error is at fp32's level (float32, float32x3): the tolerances of float32 apply."""
        return self.name in ("float32", "float32x3")

    def describe(self) -> str:
        if self.name == "float32":
            return "float32 (float storage and arithmetic)"
        return f"{self.name} ({self.doc}; fp32 accumulation, cell math, states and outputs)"


PRECISIONS = {
    "float32": Precision("float32", "float", "float", "f", "float32"),
    "tf32": Precision("tf32", "float", "float", "f", "float32", "tf32", 1, "float", 4, 8,
                      "matmul operands rounded to TF32 for tensor-core MMA"),
    "float16": Precision("float16", "float", "float", "f", "float32", "fp16", 2, "unsigned short", 2, 16,
                         "weights stored in fp16, activations rounded to fp16 for tensor-core MMA"),
    "bfloat16": Precision("bfloat16", "float", "float", "f", "float32", "bf16", 3, "unsigned short", 2, 16,
                          "weights stored in bf16, activations rounded to bf16 for tensor-core MMA"),
    "float32x3": Precision("float32x3", "float", "float", "f", "float32", "fp32x3", 4, "float", 4, 8,
                           "3xTF32: each matmul operand split into two TF32 parts, three tensor-core MMAs of them"),
}
SHORT_NAMES = {p.short: p.name for p in PRECISIONS.values()}


def precision(name: str) -> Precision:
    """The mode by name ("float32", "tf32", "float16", "bfloat16", "float32x3"; the short names fp32/fp16/bf16/fp32x3
    too)."""
    if not isinstance(name, str) or SHORT_NAMES.get(name, name) not in PRECISIONS:
        raise CompileError(f"precision {repr(name)[:60]} is not supported; hint: use one of {', '.join(PRECISIONS)}")
    name = SHORT_NAMES.get(name, name)
    return PRECISIONS[name]
