"""The per-layer argument table of the wavefront kernels (`struct LayerArgs`): which fields it has, in which order
the host packs them (engine/schedules/base.py, one int64 a field), and the buffers whose 16-bit copies the kernels
keep beside the fp32 values (half_copies). engine/codegen/wavefront.py renders the struct into each kernel."""
from __future__ import annotations

from dataclasses import dataclass

from ..c_names import c_identifier
from ..errors import CompileError
from ..plan import Program
from .precision import precision as lookup_precision


@dataclass(frozen=True)
class LayerField:
    """One 8-byte field of the per-layer argument struct: a device pointer, or the layer's input size."""

    name: str                  # C field name (with [0]/[1] for the two versions of a double buffer)
    kind: str                  # "buffer", "input", "half", "input_half", "weight", "bias", "param", "size",
                               # "lengths" (the sequences' steps, Program.lengths), "pool", "timing"
    source: str                # buffer, GEMM or parameter name
    version: int | None = None


HALF_SUFFIX = "_h16"           # the 16-bit copy of buffer `name` is field `name_h16`


def half_copies(program: Program, tiling=None) -> tuple[str, ...]:
    """The buffers whose 16-bit copy the kernels keep beside the fp32 values: on the fp16 / bf16 tensor-core
    path, every buffer a GEMM of the kernel reads as X (the recurrent inputs; with the input projections in the
    kernel, the layer input and so the layer output). The cell code writes the copy as it stores the fp32
    value, rounded to the mode once (kernels/tile_gemm.cuh rnn_bits16), and the GEMMs stage it: half the bytes
    of fp32 through L2 and shared memory, and fragments that load with ldmatrix (kernels/mma_gemm.cuh)."""
    prec = lookup_precision(program.precision)
    if tiling is None or not tiling.mma or prec.weight_bytes != 2:
        return ()
    in_kernel = {t.name for t in tiling.gemms}
    names = []
    for g in program.gemms:
        if g.name in in_kernel:
            names += [program.input_buffer, program.output_buffer] if g.hoisted else [g.in_buffer]
    written_by_gemms = {g.out_buffer for g in program.gemms} & set(names)
    if written_by_gemms:
        raise CompileError(f"cell '{program.cell.name}': buffer {sorted(written_by_gemms)[0]!r} is both a GEMM's "
                           "output and another GEMM's input, so the cell code cannot keep its 16-bit copy; hint: "
                           "this is a bug in the planner, run with precision='float32' meanwhile")
    return tuple(dict.fromkeys(names))


def layer_fields(program: Program, tiling=None, pooled: bool = False) -> tuple[LayerField, ...]:
    """The layout of `struct LayerArgs`, in order. The host packs one int64 per field per layer. pooled (the module
    has pools between or after layers): the pooled output (null where no pool follows the layer), the pool and the
    layer's step timing (TIMING_FIELDS)."""
    fields = []
    halves = half_copies(program, tiling)
    for buf in program.buffers:
        if buf.name == program.input_buffer:
            fields.append(LayerField(buf.name, "input", buf.name))
        elif buf.double:
            fields += [LayerField(buf.name, "buffer", buf.name, 0), LayerField(buf.name, "buffer", buf.name, 1)]
        else:
            fields.append(LayerField(buf.name, "buffer", buf.name))
    for buf in program.buffers:
        if buf.name not in halves:
            continue
        name = buf.name + HALF_SUFFIX
        if buf.name == program.input_buffer:
            fields.append(LayerField(name, "input_half", buf.name))
        elif buf.double:
            fields += [LayerField(name, "half", buf.name, 0), LayerField(name, "half", buf.name, 1)]
        else:
            fields.append(LayerField(name, "half", buf.name))
    for g in program.gemms:
        fields += [LayerField(f"W_{g.name}", "weight", g.name), LayerField(f"bias_{g.name}", "bias", g.name)]
    for name, field in param_fields(program).items():
        fields.append(LayerField(field, "param", name))
    fields.append(LayerField("I", "size", "I"))
    if program.lengths:
        fields.append(LayerField("lengths", "lengths", "lengths"))
    if pooled:
        fields.append(LayerField("pool_out", "pool", program.output_buffer))
        fields += [LayerField(name, "timing", name) for name in TIMING_FIELDS]
    return tuple(fields)


def param_fields(program: Program) -> dict[str, str]:
    """{parameter: its field of LayerArgs}: p_<parameter>, respelled where that is not a fit C name or is the name of
    another field (engine/c_names.py)."""
    taken = {b.name + suffix for b in program.buffers for suffix in ("", HALF_SUFFIX)} | {"I", "lengths", "pool_out"}
    taken |= {f"{prefix}_{g.name}" for g in program.gemms for prefix in ("W", "bias")} | set(TIMING_FIELDS)
    fields = {}
    for name in program.kernel_params:
        fields[name] = c_identifier(f"p_{name}", taken)
        taken.add(fields[name])
    return fields


# With pools (render_wavefront's `pools`): what each layer's row of the argument table adds beside the pooled output.
TIMING_FIELDS = {
    "pool_steps": "T_out of the pool after this layer (0: none)",
    "pool_op": "0 max, 1 mean (kernels/pool.cuh)",
    "pool_window": "steps a pooled step covers",
    "pool_stride": "steps between pooled steps",
    "steps": "time steps this layer runs (T after the pools below it)",
    "scale": "wavefront steps between two of its steps (engine/schedules/steps.py)",
    "offset": "the wavefront step of its step 0",
    "below_scale": "it reads step t * below_scale + below_offset of the layer below",
    "below_offset": "(1, 0 without a pool between them)",
}


def struct_lines(program: Program, tiling, pooled: bool = False) -> list[str]:
    """The C declaration of `struct LayerArgs`, a comment on each field."""
    lines = ["// One per layer, packed by the host as int64s in this order (engine.codegen.layer_args.layer_fields).",
             "struct LayerArgs {"]
    seen = set()
    for f in layer_fields(program, tiling, pooled):
        if f.name in seen:
            continue
        seen.add(f.name)
        if f.kind in ("buffer", "half"):
            buf = program.buffer(f.source)
            rows = "T*B" if buf.rows == "sequence" else "B"
            dims = "[2]; " if buf.double else "; "
            ctype, doc = ("float", buf.doc) if f.kind == "buffer" else ("unsigned short", f"{f.source} in 16 bits")
            lines.append(f"    {ctype}* {f.name}{dims.rstrip()}".ljust(40) + f"// ({rows}, {buf.cols}) {doc}")
        elif f.kind == "input":
            lines.append(f"    const float* {f.name};".ljust(40)
                         + f"// (T*B, I) {program.cell.input.name}, or the output of the layer below")
        elif f.kind == "input_half":
            lines.append(f"    const unsigned short* {f.name};".ljust(40) + f"// (T*B, I) {f.source} in 16 bits")
        elif f.kind == "weight":
            wt = lookup_precision(program.precision).weight_type
            note = "" if wt == "float" else f" ({program.precision} bits)"
            lines.append(f"    const {wt}* {f.name};".ljust(40) + f"// (N, K) packed weight, interleaved rows{note}")
        elif f.kind == "bias":
            lines.append(f"    const float* {f.name};".ljust(40) + "// (N,) folded biases, or null")
        elif f.kind == "param":
            lines.append(f"    const float* {f.name};".ljust(40) + f"// (H,) parameter {f.source}")
        elif f.kind == "pool":
            lines.append(f"    float* {f.name};".ljust(40) + f"// (T_out*B, {program.buffer(f.source).cols}) {f.source} "
                         "pooled over time, or null: no pool after this layer")
        elif f.kind == "timing":
            lines.append(f"    long long {f.name};".ljust(40) + f"// {TIMING_FIELDS[f.name]}")
        elif f.kind == "lengths":
            lines.append(f"    const int* {f.name};".ljust(40) + "// (B,) steps of each sequence (lengths=): past its "
                         "end a row's states are held, its output 0")
        else:
            lines.append("    long long I;".ljust(40) + "// the layer's input size")
    lines.append("};")
    return lines
