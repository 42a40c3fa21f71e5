"""Plumbing every layer uses: atomic writes, output locks and strict JSON (io), progress events, the
numba ``jit`` wrapper, and the allocator's settings."""
