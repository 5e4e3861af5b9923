"""Reference output for templates/reduction.cu: the sum of x, computed in float64.

The backend passes the kernel's inputs by argument name (NumPy arrays and ints) and compares the
returned array with the kernel's one-element output ``out``.

How far a correct kernel is from this, and so ``rtol = 1e-3`` in reduction.toml: the kernel adds
in float32, and its error is dominated by the atomicAdds, each of which rounds a running total
about as large as the partial sums of the input (a random walk: up to a few times
sqrt(n / 3) = 4,730 for n = 2^26 uniform values in [-1, 1)) to float32, so by up to 2^-24 of it;
k atomicAdds in no particular order add up to about sqrt(k) such errors. The worst configuration
of the space, one pass with chunks of 32 floats (k = 2^21), simulated in NumPy on the default
inputs (seed 0, whose sum is -7,829.8) for 20 random orders of the atomicAdds: relative error
1.8e-5 median, 5.2e-5 at most; with 1,024-float chunks, 4.9e-6 at most. Grid-stride
configurations make 132 to 2,112 atomicAdds, but each thread then adds up to 16,000 values in
float32: about 1e-6. rtol is twenty times the worst of these, yet a lost or doubled chunk of a
few thousand elements (a partial sum near sqrt(2000 / 3) = 26) still fails. The error is
relative to the sum, which is itself random: inputs drawn with another seed whose sum is much
closer to 0 would need a larger rtol. The GPU tests check exactness on small-integer inputs,
whose float32 sums are exact in any order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def reference(
    x: npt.NDArray[np.float32], out: npt.NDArray[np.float32], n: int
) -> dict[str, npt.NDArray[np.float64]]:
    """out[0] = x[0] + ... + x[n-1]; the input contents of ``out`` are ignored (the check zeroes
    it before the launch, as its ``fill = "zeros"`` asks)."""
    total = np.add.reduce(np.asarray(x).ravel()[:n], dtype=np.float64)
    return {"out": np.array([total], dtype=np.float64).reshape(np.shape(out))}
