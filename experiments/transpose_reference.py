"""Reference output for templates/transpose.cu: B = A transposed.

The backend passes the kernel's inputs by argument name (NumPy arrays and ints) and compares the
returned array with the kernel's output ``B``. A transpose only moves values, so the expected
output is A's own float32 values, rearranged: exact, and no float64 copy is needed to make it so
(at the default 8192 x 8192 it would be another 512 MiB).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def reference(
    A: npt.NDArray[np.float32], B: npt.NDArray[np.float32], rows: int, cols: int
) -> dict[str, npt.NDArray[np.float32]]:
    """B[cols, rows] = A[rows, cols].T; the input contents of ``B`` are ignored (overwritten)."""
    a = np.asarray(A).reshape(rows, cols)
    return {"B": np.ascontiguousarray(a.T).reshape(np.shape(B))}
