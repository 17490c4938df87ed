"""Benchmarks the way the field report ran them: prefill and decode separated, aggregate at a
concurrency, sweeps, compare tables, and capture/replay of real traffic.

Module map: prompts (mixed set, padding, calibration), client (one streaming request, timed),
metrics (/metrics deltas), deployment (what the target is), run (a bench run), sweep, compare,
plot, capture (fail-open proxy), replay, results (JSON files), stats, progress.
"""
