"""SSIM (Wang et al., 2004) of two 8-bit grayscale pictures, in plain Python: mean over every 7x7 window (the
uniform-window form, as scikit-image computes it with `gaussian_weights=False`), K1 0.01, K2 0.03. Slow but
exact; the tests compare a few small pictures with it."""

from __future__ import annotations

from PIL import Image

WIN = 7
C1 = (0.01 * 255) ** 2
C2 = (0.03 * 255) ** 2


def _integral(values: list[float], width: int, height: int) -> list[float]:
    table = [0.0] * ((width + 1) * (height + 1))
    for y in range(height):
        row, above, here = 0.0, y * (width + 1), (y + 1) * (width + 1)
        for x in range(width):
            row += values[y * width + x]
            table[here + x + 1] = table[above + x + 1] + row
    return table


def _window_sum(table: list[float], width: int, x: int, y: int) -> float:
    stride = width + 1
    return (table[(y + WIN) * stride + x + WIN] - table[y * stride + x + WIN]
            - table[(y + WIN) * stride + x] + table[y * stride + x])


def ssim(a: Image.Image, b: Image.Image) -> float:
    """Mean SSIM of the luma of `a` and `b`, which must be the same size."""
    assert a.size == b.size, (a.size, b.size)
    width, height = a.size
    xs = [float(v) for v in a.convert("L").tobytes()]
    ys = [float(v) for v in b.convert("L").tobytes()]
    sums = [_integral(v, width, height) for v in (xs, ys, [x * x for x in xs], [y * y for y in ys],
                                                    [x * y for x, y in zip(xs, ys, strict=True)])]
    n = WIN * WIN
    unbiased = n / (n - 1)  # sample (co)variances, as scikit-image uses
    total, count = 0.0, 0
    for y in range(height - WIN + 1):
        for x in range(width - WIN + 1):
            sx, sy, sxx, syy, sxy = (_window_sum(t, width, x, y) / n for t in sums)
            vx, vy, cov = (sxx - sx * sx) * unbiased, (syy - sy * sy) * unbiased, (sxy - sx * sy) * unbiased
            total += ((2 * sx * sy + C1) * (2 * cov + C2)) / ((sx * sx + sy * sy + C1) * (vx + vy + C2))
            count += 1
    return total / count
