"""Nsight Compute counters: why a configuration is slow, read on chosen trials.

``metrics`` names the counters and the ncu metrics behind them, ``ncu`` runs Nsight Compute and
reads its CSV, ``target`` is the process it profiles, ``profiler`` profiles a batch of
configurations with one ncu process, ``policy`` chooses which (elite, failures, all, none)
within a budget, and ``diagnosis`` turns counters into a one-line reason.
"""

__all__: list[str] = []
