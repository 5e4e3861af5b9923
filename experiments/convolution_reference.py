"""Reference outputs for templates/convolution.cu, computed in float64.

    output[y, x] = sum_{i < FH, j < FW} input[y + i, x + j] * filter[i, j]

for an input already padded to (H + FH - 1) x (W + FW - 1): a correlation, as
``torch.nn.functional.conv2d(input[None, None], filter[None, None])[0, 0]`` computes it.

At the default size (4096^2 outputs, a 17x17 filter: 4.8e9 multiply-adds) a direct sum in NumPy
takes tens of seconds, so the correlation is computed by FFT, in float64: the circular correlation
over a grid at least as large as the input has no wrap-around in the H x W outputs that are kept.
Its error (about 1e-15 of the output's scale) is far below the float32 kernel's, so the tolerance
still measures the kernel's rounding, not the reference's. The grid is rounded up to a length with
only small prime factors (the padded 4112 = 16 x 257 would be slow). About 2 s at the default size.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def _fast_length(n: int) -> int:
    """The smallest m >= n whose prime factors are all 2, 3, 5 or 7 (quick for pocketfft)."""
    m = n
    while True:
        k = m
        for p in (2, 3, 5, 7):
            while k % p == 0:
                k //= p
        if k == 1:
            return m
        m += 1


def correlate_fft(image: npt.ArrayLike, kernel: npt.ArrayLike, H: int, W: int) -> np.ndarray:
    """The H x W 'valid' correlation of a padded image with a kernel, by FFT in float64."""
    a = np.asarray(image, dtype=np.float64)
    k = np.asarray(kernel, dtype=np.float64)
    fh, fw = k.shape
    shape = (_fast_length(a.shape[0]), _fast_length(a.shape[1]))
    # correlation = convolution with the flipped kernel, shifted by the kernel's size minus one
    spectrum = np.fft.rfft2(a, s=shape) * np.fft.rfft2(k[::-1, ::-1], s=shape)
    full = np.fft.irfft2(spectrum, s=shape)
    return full[fh - 1 : fh - 1 + H, fw - 1 : fw - 1 + W]


def reference(
    input: npt.NDArray[np.float32],
    filter: npt.NDArray[np.float32],
    output: npt.NDArray[np.float32],
    W: int,
    H: int,
) -> dict[str, npt.NDArray[np.float64]]:
    """The expected ``output``; its input contents are ignored (the kernel overwrites it)."""
    H, W = int(H), int(W)
    fh, fw = np.shape(filter)
    image = np.asarray(input).reshape(H + fh - 1, W + fw - 1)
    return {"output": correlate_fft(image, filter, H, W).reshape(np.shape(output))}
