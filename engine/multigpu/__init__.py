"""A net's layers pipelined over the GPUs of one host (issue #11).

- plan.py: the cost model, the split of the layers over the GPUs and the chunk size (plan_pipeline), no GPU touched.
- results.py: PipelineMeasurement, what a pipelined run measured.
- pieces.py: what each GPU runs of a plan, and which GPUs' pieces join into one wavefront program.
- program.py: PipelineProgram, the chunks run diagonal by diagonal over the GPUs (or on the CPU, backend='reference').
- tuner.py: tune_pipeline measures chunks and splits and keeps the fastest on disk; tuned_plan reads it back.

May import: engine.nets, engine.execute, engine.schedules, engine.backends, engine.chunk_replay and lower modules
(engine.flops for the cost model); never engine.bench, engine.api, engine.explain or engine.export.
"""
from .pieces import Piece, gpu_fused_runs, pieces_of
from .plan import PipelinePlan, Unit, chunk_steps, layers_net, plan_pipeline, units_of
from .program import PipelineProgram, synchronize, wall_ms
from .results import PipelineMeasurement
from .tuner import PIPELINE_CACHE, block_boundary_split, tune_pipeline, tuned_key, tuned_plan

__all__ = ["Piece", "gpu_fused_runs", "pieces_of", "PipelinePlan", "Unit", "chunk_steps", "layers_net",
           "plan_pipeline", "units_of", "PipelineProgram", "synchronize", "wall_ms", "PipelineMeasurement",
           "PIPELINE_CACHE", "block_boundary_split", "tune_pipeline", "tuned_key", "tuned_plan"]
