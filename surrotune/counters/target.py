"""``python -m surrotune.counters.target JOBS``: the process ncu profiles.

It builds the experiment's inputs once (as the worker does), then, between
``cudaProfilerStart`` and ``cudaProfilerStop`` (ncu runs with ``--profile-from-start off``, so
the copies and fills that prepare the inputs are not profiled), launches each job's kernel once,
in order: the n-th profiled launch is the n-th job. A job whose launch fails is reported on
stderr and skipped; the others go on, so one bad configuration does not cost the batch.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "profile_launches"]


def profile_launches(jobs: Sequence[object]) -> int:
    """Launch each job once inside the profiled range; the number of failed launches."""
    import cupy

    from surrotune.backends.sanitize import SanitizeJob, launch_arguments, launch_kernel

    launches = [job for job in jobs if isinstance(job, SanitizeJob)]
    if not launches:
        return 0
    args = launch_arguments(launches[0].experiment, launches[0].device_id, pool=True)
    failed = 0
    cupy.cuda.profiler.start()
    try:
        for index, job in enumerate(launches):
            code = launch_kernel(job, args)
            if code:
                failed += 1
                print(f"surrotune counters target: job {index} failed", file=sys.stderr)
                break  # a sticky CUDA error ends the process's context: nothing more can run
    finally:
        cupy.cuda.profiler.stop()
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m surrotune.counters.target JOBS.pickle", file=sys.stderr)
        return 2
    jobs = pickle.loads(Path(args[0]).read_bytes())
    failed = profile_launches(jobs)
    print(f"surrotune counters target: {len(jobs) - failed} of {len(jobs)} launched")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover - runs under ncu
    sys.exit(main())
