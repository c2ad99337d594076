"""C identifiers for generated CUDA: every name the code generators derive from a cell (node, state, input, cell and
parameter names) passes through here, so that any valid node name compiles.

A graph name is kept as it is unless it is reserved:
- a C, C++ or CUDA keyword or built-in (KEYWORDS);
- a macro of the headers the generated code sees (c_reserved_names.txt, made from the toolchain by
  benchmarks/c_reserved_names.py): `NULL`, `EOF`, `errno`, `assert`, `INT_MAX`, `M_PI`, `CUDART_VERSION`, ...;
- a name the generated code itself uses beside the graph's (GENERATED_NAMES: loop indices, sizes, the host
  driver's functions) or a helper of kernels/ (helper_names);
- spelled like an implementation name: a leading or trailing '_' (C++ reserves '_' + capital and '__' anywhere;
  composites such as `p_<name>` or `<name>_seq` must not form one either), or not ASCII (kernel names must be).
A reserved name is respelled (c_identifier): ASCII, no '__', no leading or trailing '_', then `_v` appended until
it is neither reserved nor taken. Ordinary names are unchanged, so generated code keeps the graph's names.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

MACROS_FILE = Path(__file__).with_name("c_reserved_names.txt")
KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"

KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline int long register
restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
alignas alignof and and_eq asm bitand bitor bool catch char8_t char16_t char32_t class compl concept const_cast
consteval constexpr constinit co_await co_return co_yield decltype delete dynamic_cast explicit export false final
friend import module mutable namespace new noexcept not not_eq nullptr operator or or_eq override private protected
public reinterpret_cast requires static_assert static_cast template this thread_local throw true try typeid typename
using virtual wchar_t xor xor_eq
threadIdx blockIdx blockDim gridDim warpSize clusterDim clusterIdx dim3 size_t half nv_bfloat16 std main
""".split())

# Names the generated code uses next to the graph's: the kernels' indices and sizes (engine/codegen/cuda.py), the
# wavefront schedules' block variables and constants (engine/codegen/wavefront.py), the host driver of the exported
# program (engine/export.py), the math functions the ops' CUDA forms call.
GENERATED_NAMES = frozenset("""
expf exp tanhf tanh fmaxf fminf fmax fmin min max sqrtf fmaf
idx total b j t B I H P row NAN INFINITY e k tk busy grid cg cooperative_groups smem layer layers L u0 tu K N
T UNITS THREADS WM WN BULK W_KEEP RB RC K_CHUNK STAGES NC_STREAMED SCRATCH NUM_LAYERS BLOCKS_PER_LAYER S
LayerArgs arrivals within lengths
Layer cur next blocks_for gemm_rows project step run_network read_floats write_floats copy_columns_to_device
copy_columns_to_host kInputSize kHiddenSize kLayers kChunkSteps kThreads CUDA_CHECK CUBLAS_CHECK handle stream
""".split())


def reserved_by_spelling(name: str) -> bool:
    """Whether the spelling alone makes `name` unfit: leading or trailing '_', '__' inside, not ASCII."""
    return name.startswith("_") or name.endswith("_") or "__" in name or not name.isascii()


@lru_cache(maxsize=1)
def header_macros() -> frozenset[str]:
    """The macro names of c_reserved_names.txt."""
    lines = MACROS_FILE.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@lru_cache(maxsize=1)
def helper_names() -> frozenset[str]:
    """Names the hand-written kernels/ files define for generated code to call: rnn_* helpers, their types and
    macros (a variable named like one would hide it from the statements after it)."""
    names: set[str] = set()
    for path in sorted(KERNELS_DIR.glob("*.cu*")):
        text = path.read_text()
        names |= set(re.findall(r"\b((?:rnn|Rnn|RNN)_?\w+)\b", text))
        names |= set(re.findall(r"^\s*#\s*define\s+(\w+)", text, flags=re.M))
        names |= set(re.findall(r"__device__[^;{(=]*?\b(\w+)\s*\(", text))
    return frozenset(names)


@lru_cache(maxsize=1)
def reserved_names() -> frozenset[str]:
    """Every name a generated identifier must not be, beside those refused by their spelling."""
    return KEYWORDS | GENERATED_NAMES | header_macros() | helper_names()


def reserved(name: str) -> bool:
    return reserved_by_spelling(name) or name in reserved_names()


def _spelled(name: str) -> str:
    """ASCII letters, digits and single inner '_': other characters become their code point (u3b1) or '_'."""
    ascii_name = "".join(ch if ch.isascii() else f"u{ord(ch):x}" for ch in name)
    return re.sub(r"_+", "_", re.sub(r"\W", "_", ascii_name)).strip("_")


def c_identifier(name: str, taken=frozenset()) -> str:
    """`name` if it is fit for C and not in `taken`, else its respelling with `_v` appended until it is."""
    candidate = name
    if reserved_by_spelling(name):
        candidate = _spelled(name)
        candidate = candidate if candidate[:1].isalpha() else f"v{candidate}"
    while candidate in taken or reserved(candidate):
        candidate += "_v"
    return candidate


def kernel_prefix(cell_name: str) -> str:
    """The stem of a cell's kernel and program names: the cell name as an ASCII identifier (a cell name may hold
    any character: spaces, punctuation and letters outside ASCII are respelled)."""
    prefix = _spelled(cell_name)
    return prefix if prefix[:1].isalpha() and prefix[:1] == cell_name[:1] else f"cell_{prefix}".rstrip("_")


def ascii_identifiers(source: str) -> str:
    """`source` with every identifier that holds a letter outside ASCII respelled (c_identifier), the same way at
    each use and unlike any other identifier of the source: NVRTC takes only ASCII identifiers. For generators
    that prefix the graph's names (v_<value>, param_<name>): a prefix keeps them clear of keywords and macros."""
    found = set(re.findall(r"\w+", source))
    odd = sorted(name for name in found if not name.isascii())
    if not odd:
        return source
    taken = {name for name in found if name.isascii()}
    spelled = {}
    for name in odd:
        spelled[name] = c_identifier(name, taken)
        taken.add(spelled[name])
    return re.sub(r"\w+", lambda m: spelled.get(m.group(0), m.group(0)), source)
