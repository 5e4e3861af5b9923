"""The bench's worker processes run their BLAS and OpenMP pools on one thread each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, threadpoolctl
from surrotune.bench import harness
harness._one_thread_each()
import os
print(json.dumps({"pools": [(p["internal_api"], p["num_threads"])
                            for p in threadpoolctl.threadpool_info()],
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def test_a_worker_limits_every_loaded_pool_to_one_thread() -> None:
    """Run in a fresh interpreter (the limit is process-wide): SciPy's, scikit-learn's and
    XGBoost's pools are loaded and each runs one thread, and pools loaded later are told so by
    the environment."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    pools = report["pools"]
    assert any(api in ("openblas", "mkl", "blis") for api, _ in pools)  # a BLAS was loaded
    assert all(threads == 1 for _, threads in pools), pools
    assert report["env"] == "1"
