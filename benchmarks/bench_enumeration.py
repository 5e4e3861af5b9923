"""Benchmark: vectorised SearchSpace enumeration against a naive per-configuration loop.

GEMM-like spaces (CLBlast's xgemm parameters) whose cartesian products are 10^4 ... 10^7, with
the constraints such a kernel really has: tile sizes divisible by thread-block size times vector
width, 32 to 1024 threads per block, and shared memory within 48 KB. Prints a markdown table:
enumeration time (best of ``--repeat``), the feasible count, and for the smaller spaces the time of
the obvious loop over ``itertools.product`` evaluating each constraint per configuration.

    python benchmarks/bench_enumeration.py [--max-exponent 7] [--naive-max-exponent 5]

(with surrotune installed, e.g. ``pip install -e .``, or ``PYTHONPATH=.`` from the repository).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

from surrotune.expressions import Expression
from surrotune.space import SearchSpace

SIZES = {"M": 4096, "N": 4096, "K": 4096, "SMEM_BYTES": 48 * 1024, "DTYPE_BYTES": 4}

#: parameters added level by level; each level multiplies the product by 10
LEVELS: list[dict[str, list[int]]] = [
    {
        "MWG": [16, 32, 64, 128, 256],
        "NWG": [16, 32, 64, 128, 256],
        "KWG": [8, 16, 32, 64],
        "MDIMC": [4, 8, 16, 32, 64],
        "NDIMC": [4, 8, 16, 32, 64],
        "VWM": [1, 2, 4, 8],
    },
    {"VWN": [1, 2, 4, 8, 16], "SA": [0, 1]},
    {"SB": [0, 1], "KWI": [1, 2, 4, 8, 16]},
    {"MDIMA": [2, 4, 8, 16, 32], "STRM": [0, 1]},
]

#: constraints, each used when all of its parameters are in the space
CONSTRAINTS = [
    "MWG % (MDIMC * VWM) == 0",
    "NWG % (NDIMC * VWN) == 0",
    "NWG % NDIMC == 0",
    "32 <= MDIMC * NDIMC <= 1024",
    "M % MWG == 0 and N % NWG == 0 and K % KWG == 0",
    "KWG % KWI == 0",
    "(SA * KWG * MWG + SB * KWG * NWG) * DTYPE_BYTES <= SMEM_BYTES",
    "KWG * (MWG + NWG) * DTYPE_BYTES <= 2 * SMEM_BYTES",
    "MWG % (MDIMA * VWM) == 0 and KWG % ((MDIMC * NDIMC) // MDIMA) == 0",
    "STRM == 0 or MDIMC * VWM <= MWG // 2",
]


def gemm_space(exponent: int) -> SearchSpace:
    """The GEMM-like space with a product of 10^exponent (exponent 4 to 7)."""
    params: dict[str, list[int]] = {}
    for level in LEVELS[: exponent - 3]:
        params.update(level)
    known = set(params) | set(SIZES)
    constraints = [c for c in CONSTRAINTS if Expression.parse(c).names <= known]
    space = SearchSpace(params, constraints, SIZES, max_enumerate=50_000_000)
    assert space.product_size == 10**exponent, space.product_size
    return space


def naive_count(space: SearchSpace) -> int:
    """The obvious way: every product element, every constraint, one Python evaluation each."""
    exprs = space.constraints
    names = space.names
    count = 0
    for combo in itertools.product(*space.values.values()):
        env = {**space.sizes, **dict(zip(names, combo, strict=True))}
        if all(bool(e.evaluate(env)) for e in exprs):
            count += 1
    return count


def best_of(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    best, result = math.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-exponent", type=int, default=7, choices=range(4, 8))
    parser.add_argument("--naive-max-exponent", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    print("| product | parameters | constraints | feasible | enumerate (best of "
          f"{args.repeat}) | naive loop (best of {args.repeat}) | speed-up |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for exponent in range(4, args.max_exponent + 1):
        # a fresh space per run, so that the enumeration cache does not flatter the timing
        seconds, count = best_of(args.repeat, lambda e=exponent: len(gemm_space(e).enumerate()))
        space = gemm_space(exponent)
        naive_cell, speedup_cell = "—", "—"
        if exponent <= args.naive_max_exponent:
            naive, naive_feasible = best_of(args.repeat, lambda s=space: naive_count(s))
            assert naive_feasible == count, (naive_feasible, count)
            naive_cell, speedup_cell = f"{naive:.3f} s", f"{naive / seconds:,.0f}×"
        print(
            f"| 10^{exponent} | {len(space.names)} | {len(space.constraints)} | {count:,} "
            f"| {seconds * 1e3:.1f} ms | {naive_cell} | {speedup_cell} |"
        )


if __name__ == "__main__":
    main()
