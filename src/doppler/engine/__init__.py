"""Real work-conserving execution of dataflow graphs.

``engine.kernels`` holds the fixed kernel whitelist that op specs name (numpy
implementations, the reference evaluator and the FLOP formulas); the executors
(local threads, Dask) run the same specs on real devices.
"""
