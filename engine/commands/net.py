"""`python -m engine net <preset or net.json>`: describe a network of blocks, or run it (reference or a GPU backend).

    python -m engine net deepspeech                       # the blocks, their sizes and sequence lengths
    python -m engine net deepspeech --json > ds.json      # its JSON, to edit
    python -m engine net ds.json --run -T 100 -B 4        # run it (NumPy reference), save the outputs
    python -m engine net deepspeech --run --backend persistent --fuse-pools   # on the GPU, pools folded in
    python -m engine net deepspeech --gpus 2 -T 100 -B 64 # the pipeline plan over 2 GPUs (engine/multigpu)
    python -m engine net deepspeech --gpus 2 -T 100 -B 64 --measure   # ... run on the GPUs: time, measured bubble
    python -m engine net deepspeech --gpus 2 -T 100 -B 64 --tune      # ... try chunks and splits, keep the fastest
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import backends
from ..errors import BackendError
from ..files import check_destination, write_with
from ..multigpu import tuner
from ..multigpu.plan import plan_pipeline
from ..multigpu.program import PipelineProgram, wall_ms
from ..nets.data import Layers, init_net_params
from ..nets.io import load_net, net_to_json
from ..nets.presets import NET_PRESETS, net_preset
from ..nets.runner import NET_BACKENDS, prepare_net
from ._common import add_seed_arg, batch_flag, check_array_fits, check_input_file, int_flag, size_flag, steps_flag


def add_parser(sub) -> None:
    p = sub.add_parser("net", help="describe or run a network of blocks (cell layers, pooling over time)")
    p.add_argument("net", help=f"network preset ({', '.join(NET_PRESETS)}) or path to a network JSON file")
    p.add_argument("--input-size", "-I", type=size_flag, default=None,
                   help="input size of a preset net (default its own)")
    p.add_argument("--hidden-size", "-H", type=size_flag, default=None, help="hidden size of a preset net")
    p.add_argument("--json", action="store_true", help="print the network's JSON")
    p.add_argument("--run", action="store_true", help="run it on random inputs (the NumPy reference unless --backend)")
    p.add_argument("--backend", choices=NET_BACKENDS, default="reference",
                   help="with --run: reference (NumPy, float64), or a GPU backend (float32)")
    p.add_argument("--fuse-pools", action="store_true",
                   help="with --run on graph, persistent or auto: fold each pool into the kernel of the block before "
                        "it; with --gpus and --measure/--tune: run each GPU's pieces as one such program")
    p.add_argument("--steps", "-T", type=steps_flag, default=20, help="time steps T (default 20)")
    p.add_argument("--batch", "-B", type=batch_flag, default=4, help="batch size B (default 4)")
    add_seed_arg(p, "parameters and inputs")
    p.add_argument("-o", "--output", default="net_outputs.npz",
                   help="where --run saves the outputs (an .npz archive, written at exactly this path and replaced "
                        "if it exists; checked before the run)")
    p.add_argument("--gpus", type=int_flag(1, 1024), default=None,
                   help="plan pipelining the layers over this many GPUs (which layers where, chunk size, bubble)")
    p.add_argument("--split", default=None, help="with --gpus: layers per GPU, e.g. 4,4 (default: chosen)")
    p.add_argument("--chunk", type=steps_flag, default=None, help="with --gpus: steps per chunk (default: chosen)")
    p.add_argument("--measure", action="store_true",
                   help="with --gpus: run the plan on the GPUs (--backend graph or persistent; default persistent) and "
                        "show its time, the one-GPU time and the measured bubble")
    p.add_argument("--tune", action="store_true",
                   help="with --gpus: measure the plan's chunk, chunks around it and splits at block boundaries, and "
                        "keep the fastest")
    p.set_defaults(func=main)


def resolve(args):
    if args.net in NET_PRESETS:
        sizes = {k: v for k, v in (("input_size", args.input_size), ("hidden_size", args.hidden_size)) if v is not None}
        return net_preset(args.net, **sizes)
    path = Path(args.net)
    if path.suffix == ".json" or path.exists():
        if args.input_size is not None or args.hidden_size is not None:
            raise BackendError("--input-size and --hidden-size apply to preset nets; hint: edit the sizes in the JSON "
                               "file")
        return load_net(check_input_file(path, "net", "network", "give a network preset "
                                         f"({', '.join(NET_PRESETS)}) or a network JSON file", text=True))
    return net_preset(args.net)                # unknown: the error suggests the closest preset


def main(args) -> int:
    net = resolve(args)
    if args.json:
        print(net_to_json(net))
        return 0
    out = check_destination(args.output, "outputs", flag="--output", example="net_outputs.npz") if args.run else None   # before the work
    steps = net.steps(args.steps)
    plan = None
    if args.gpus is not None:                  # planned first: a bad request is refused before anything prints
        split = None
        if args.split:
            try:
                split = [int(v) for v in args.split.split(",")]
            except ValueError:
                raise BackendError(f"--split must be layer counts separated by commas; got {args.split!r}; hint: e.g. "
                                   "--split 4,4") \
                    from None
        if (args.measure or args.tune) and args.run:
            raise BackendError("--measure and --tune run the pipeline themselves; hint: leave out --run")
        plan = plan_pipeline(net, args.gpus, args.steps, args.batch, split=split, chunk=args.chunk)
        if args.measure or args.tune:
            plan = measure_plan(net, plan, args, split)
    elif args.measure or args.tune or args.chunk is not None:
        raise BackendError("--measure, --tune and --chunk apply to a pipeline plan; hint: add --gpus N")
    print(f"net '{net.name}': input size {net.input_size}, output size {net.output_size}"
          + (f" ({net.doc})" if net.doc else ""))
    for k, block in enumerate(net.blocks):
        what = (f"{block.num_layers} x {block.cell.name}, hidden {block.hidden_size}, {block.direction}"
                + (f" ({block.merge})" if block.bidirectional else "") if isinstance(block, Layers)
                else f"{block.op} over {block.window} step(s), stride {block.stride}")
        print(f"  block {k} {block.label!r}: {what}; reads ({steps[k]}, B, {net.sizes[k]})")
    if plan is not None:
        print(plan.describe())
        if not (args.measure or args.tune):
            tuned = cached_tuned_plan(net, args)
            if tuned is not None:
                print("the tuned plan on this machine (`--tune` found it fastest; engine.multigpu.tuner.tuned_plan):")
                print(tuned.describe())
    if not args.run:
        return 0
    check_array_fits("the random input x", (args.steps, args.batch, net.input_size), "--steps or --batch")
    x = np.random.default_rng(args.seed + 1).standard_normal((args.steps, args.batch, net.input_size))
    program = prepare_net(net, init_net_params(net, seed=args.seed), args.backend, fuse_pools=args.fuse_pools)
    result = program.run(x)
    outputs = np.asarray(result.outputs.get() if hasattr(result.outputs, "get") else result.outputs)
    write_with(out, lambda f: np.savez(f, outputs=outputs), "outputs", flag="--output")
    for k, why in sorted(program.fused.items()):
        print(f"  block {k}: {why}")
    print(f"ran it on backend '{args.backend}': x {x.shape} -> outputs {outputs.shape}; saved to {out}")
    return 0


def measure_plan(net, plan, args, split):
    """--measure / --tune: the plan run on this host's GPUs (engine.multigpu), against the net in one piece on GPU 0."""
    flag = "--tune" if args.tune else "--measure"
    ok, why = backends.gpu_status()
    if not ok:
        raise BackendError(f"{flag} runs the plan on {args.gpus} GPU(s), but this machine has none usable: {why}; "
                           "hint: leave out --measure and --tune to see the plan without a GPU")
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    present = cupy.cuda.runtime.getDeviceCount()
    if args.gpus > present:
        raise BackendError(f"{flag} runs the plan on {args.gpus} GPUs, but this host has {present}; "
                           f"hint: --gpus {present} or fewer")
    backend = "persistent" if args.backend == "reference" else args.backend
    if backend not in ("graph", "persistent"):
        raise BackendError(f"{flag} pipelines with backend 'graph' or 'persistent' (their runs do not wait for the "
                           f"GPU, so the GPUs overlap); got --backend {args.backend}; hint: --backend persistent")
    params = init_net_params(net, seed=args.seed)
    with cupy.cuda.Device(0):
        x = cupy.asarray(np.random.default_rng(args.seed + 1).standard_normal((args.steps, args.batch,
                                                                                net.input_size)), dtype=cupy.float32)
    if args.tune:
        chunks = None if args.chunk is None else [args.chunk]
        plan, rows = tuner.tune_pipeline(net, params, args.gpus, args.steps, args.batch, backend=backend, x=x,
                                   chunks=chunks, splits=None if split is None else [split],
                                   fuse_pools=args.fuse_pools)
        for row in rows:
            what = (f"{row['ms']:.2f} ms, bubble {100 * row['bubble']:.0f}%" if "ms" in row else row["error"])
            print(f"  tried split {row['split']}, chunks of {row['chunk']}: {what} "
                  f"(predicted {row['predicted_ms']:.2f} ms)")
    else:
        program = PipelineProgram(net, params, plan, backend=backend, fuse_pools=args.fuse_pools)
        for g, why in sorted(program.fused.items()):
            print(f"  GPU {g}: {why}")
        plan.measured = program.measure(x)
    with cupy.cuda.Device(0):                   # the net in one piece on one GPU, timed the same way
        one = prepare_net(net, params, backend)
        plan.measured.one_gpu_ms = wall_ms(lambda: one.run(x), warmup=1, repeats=plan.measured.repeats)
    return plan


def cached_tuned_plan(net, args):
    """The plan `--tune` kept for this net, sizes and backend on this machine's GPUs, or None (none tuned, no GPU)."""
    if not backends.gpu_status()[0]:
        return None
    backend = "persistent" if args.backend == "reference" else args.backend
    return tuner.tuned_plan(net, args.gpus, args.steps, args.batch, backend=backend, fuse_pools=args.fuse_pools)
