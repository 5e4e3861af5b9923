"""Kernel Tuner's strategies on a recorded dataset, in Kernel Tuner's own simulation mode.

The peers are run the way their users run them, not re-implemented: ``tune_kernel(...,
simulation_mode=True, cache=FILE, strategy=NAME, strategy_options={"max_fevals": budget})``. Kernel
Tuner then answers every configuration from the cache file, and its ``max_fevals`` counts unique
configurations, failures included, exactly as surrotune counts evaluations.

- The cache: a Kernel Tuner cache is handed over as it was recorded (gunzipped into a temporary
  directory, since Kernel Tuner reads only plain ``.json``). Any other recording (T4, surrotune's
  own) is written as a Kernel Tuner cache first, failures as ``RuntimeFailedConfig`` (or
  ``CompilationFailedConfig``).
- The restrictions: the benchmark's ``spaces/<name>.json`` expressions when the harness found them,
  so Kernel Tuner builds its search space the way its users do; otherwise a predicate that admits
  exactly the configurations the recording can answer (Kernel Tuner refuses to simulate a
  configuration that passes its restrictions but is missing from the cache).
- The order: the strategy's results list, in the order its cost function ran them; a repeat of a
  configuration already evaluated and anything marked ``InvalidConfig`` cost nothing and are left
  out. The value of each configuration is read back from surrotune's own reading of the
  recording, so both kinds of runs are scored on identical numbers.
- Seeds: Kernel Tuner's strategies draw from Python's ``random`` and NumPy's global generator, so
  both are seeded before each run (``tune_kernel``'s own ``seed`` reaches only some strategies),
  and SciPy's Latin hypercube, which Kernel Tuner leaves unseeded, is seeded for the run.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import io
import json
import random
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from surrotune.backends.replay import Dataset
from surrotune.result import ParamValue, Status

__all__ = ["KT_STRATEGIES", "available", "kernel_tuner_strategies", "run_strategy", "write_cache"]

#: the strategies the benchmark compares against by default (``kt:<name>``)
KT_STRATEGIES = (
    "genetic_algorithm",
    "dual_annealing",
    "simulated_annealing",
    "pso",
    "greedy_ils",
    "diff_evo",
    "bayes_opt",
    "firefly_algorithm",
)

#: surrotune's failure statuses as Kernel Tuner markers (anything but a compile failure is a
#: runtime failure to Kernel Tuner; it treats both the same: an evaluation without a value)
_MARKERS: dict[Status, str] = {Status.COMPILE: "CompilationFailedConfig"}


def available() -> bool:
    """Whether Kernel Tuner is installed (the optional ``bench`` extra)."""
    return importlib.util.find_spec("kernel_tuner") is not None


def kernel_tuner_strategies() -> tuple[str, ...]:
    """Every strategy name the installed Kernel Tuner knows."""
    from kernel_tuner.interface import strategy_map

    return tuple(strategy_map)


def write_cache(dataset: Dataset, path: Path) -> None:
    """The dataset as a Kernel Tuner cache at ``path``: the file as recorded where it is one."""
    if dataset.format == "kernel_tuner":
        data = dataset.path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        path.write_bytes(data)
        return
    names = list(dataset.parameters)
    cache: dict[str, dict[str, Any]] = {}
    for key, result in dataset.results.items():
        if not result.status.counts_as_evaluation:
            continue
        entry: dict[str, Any] = {name: result.config[name] for name in names}
        if result.ok:
            entry[dataset.objective] = result.objective
        else:
            entry[dataset.objective] = _MARKERS.get(result.status, "RuntimeFailedConfig")
        cache[key] = entry
    doc = {
        "device_name": dataset.device_name,
        "kernel_name": dataset.kernel_name or "kernel",
        "problem_size": [1],
        "tune_params_keys": names,
        "tune_params": {name: list(values) for name, values in dataset.parameters.items()},
        "objective": dataset.objective,
        "cache": cache,
    }
    path.write_text(json.dumps(doc))


def _recorded_predicate(
    dataset: Dataset, is_feasible: Callable[[Mapping[str, ParamValue]], bool]
) -> Callable[[dict[str, Any]], bool]:
    """Admits what the replay admits: recorded, evaluable and within the known constraints."""
    keys = {
        key
        for key, result in dataset.results.items()
        if result.status.counts_as_evaluation and is_feasible(result.config)
    }

    def restriction(p: dict[str, Any]) -> bool:  # Kernel Tuner's one-argument form
        return dataset.key(p) in keys

    return restriction


@contextlib.contextmanager
def _seeded_latin_hypercube(seed: int) -> Iterator[None]:
    """Seed SciPy's Latin hypercube sampler while a strategy runs.

    Kernel Tuner's ``Searchspace.get_LHS_sample`` (the initial population of ``diff_evo``) and
    ``bayes_opt``'s initial sample build ``scipy.stats.qmc.LatinHypercube`` without a seed, and
    SciPy then draws from fresh OS entropy, so no global seed makes those runs repeatable. The
    class is replaced, for the duration of one run, in SciPy's module and in every loaded Kernel
    Tuner module that imported it by name; an explicit ``rng``/``seed`` is left alone.
    """
    import scipy.stats.qmc as qmc

    original = qmc.LatinHypercube
    rng = np.random.default_rng(seed)

    def seeded(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rng") is None and kwargs.get("seed") is None:
            kwargs["rng"] = rng
        return original(*args, **kwargs)

    # the strategies that import the class at module level (bayes_opt) hold their own name for it
    holders = [qmc] + [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("kernel_tuner") and getattr(module, "LatinHypercube", None) is original
    ]
    for holder in holders:
        holder.LatinHypercube = seeded  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for holder in holders:
            holder.LatinHypercube = original  # type: ignore[attr-defined]


def run_strategy(
    dataset: Dataset,
    strategy: str,
    *,
    budget: int,
    seed: int,
    workdir: Path,
    is_feasible: Callable[[Mapping[str, ParamValue]], bool],
    restrictions: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[list[float | None], list[str], str]:
    """One simulated Kernel Tuner run: (values in evaluation order, statuses, stop reason).

    ``restrictions`` are Kernel Tuner restriction expressions (``spaces/<name>.json``); without
    them the run is restricted to the configurations the recording can answer.
    """
    from kernel_tuner import tune_kernel
    from kernel_tuner.util import ErrorConfig, InvalidConfig

    cache_path = workdir / "cache.json"
    write_cache(dataset, cache_path)
    names = list(dataset.parameters)
    problem_size = dataset.problem_size if dataset.format == "kernel_tuner" else [1]
    restriction: Any = (
        list(restrictions) if restrictions else _recorded_predicate(dataset, is_feasible)
    )
    from kernel_tuner.interface import strategy_map

    _ = strategy_map[strategy].tune  # load the strategy's module now, so the seeding reaches it
    random.seed(seed)
    np.random.seed(seed % 2**32)
    with (
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
        _seeded_latin_hypercube(seed),
    ):
        warnings.simplefilter("ignore")
        results, _env = tune_kernel(
            dataset.kernel_name or "kernel",
            "",
            tuple(problem_size) if isinstance(problem_size, list) else problem_size,
            [],
            {name: list(values) for name, values in dataset.parameters.items()},
            restrictions=restriction,
            cache=str(cache_path),
            simulation_mode=True,
            strategy=strategy,
            strategy_options={"max_fevals": budget, **dict(options or {})},
            objective=dataset.objective,
            objective_higher_is_better=dataset.direction == "maximize",
            quiet=True,
            verbose=False,
        )
    values: list[float | None] = []
    statuses: list[str] = []
    seen: set[str] = set()
    for entry in results:
        error = entry.get("__error__")
        if isinstance(error, InvalidConfig):
            continue
        config = {name: entry[name] for name in names}
        key = dataset.key(config)
        if key in seen:
            continue
        seen.add(key)
        recorded = dataset.lookup(config)
        if recorded is None or not recorded.status.counts_as_evaluation:
            continue  # cannot happen with the restrictions above; never count it if it does
        values.append(recorded.objective if recorded.ok else None)
        statuses.append(recorded.status.value)
        if recorded.ok != (not isinstance(error, ErrorConfig)):
            raise RuntimeError(
                f"Kernel Tuner and surrotune read {key!r} of {dataset.path} differently: "
                f"{error!r} vs {recorded.status.value}"
            )
    stop = "budget" if len(values) >= budget else "strategy ended"
    return values[:budget], statuses[:budget], stop
