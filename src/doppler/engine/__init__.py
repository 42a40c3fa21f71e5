"""Real work-conserving execution of dataflow graphs (the engine lands here next).

The kernel whitelist that op specs name (numpy implementations, the reference
evaluator and the FLOP formulas) lives in :mod:`doppler.kernels`; the executors
(local threads, Dask) will run the same specs on real devices and return a
:class:`doppler.trace.Trace`, like the simulator.
"""
