"""nvcc flags for the CPU tests that only check that generated CUDA compiles (warnings as errors, no GPU): the
front end (cicc) and ptxas at -O0. Parsing, type checks, every warning and ptxas's resource checks still run; the
optimizer does not, which halves a compile (3.5 s -> 2.0 s for an LSTM's persistent source). The GPU suite compiles
the same sources through NVRTC with the engine's own options and runs them."""

CHECK_ONLY = ["-Xcicc", "-O0", "-Xptxas", "-O0"]
