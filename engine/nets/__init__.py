"""Networks of blocks: cell layers (one direction or both) and pooling over time, in sequence (issue #11).

- data.py: the net as data: Net, Layers, Pool, NetParams, their checks and init_net_params (no running).
- io.py: a Net to and from JSON (schema "rnn-network").
- presets.py: preset networks (deepspeech, stack) and net_preset.
- results.py: NetResult. pooling.py: pool_over_time.
- fusion.py: which blocks run as one wavefront program with the pools folded in (fuse_pools).
- runner.py: NetProgram, prepare_net and run_net, block by block through engine.execute.

data.py, io.py, presets.py, results.py and pooling.py sit low (the schedules import data.py for the Pool type): they
may import engine.ir, engine.network, engine.params, engine.gallery, engine.serialize and engine.backends.common.
fusion.py and runner.py sit above the schedules and may import them and engine.execute. Nothing here imports
engine.multigpu, engine.bench, engine.explain, engine.export or engine.api.
"""
