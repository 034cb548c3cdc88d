"""Fixed-width two's-complement arithmetic: the one definition every golden model uses.

Values are exact Python integers (NumPy object arrays for arrays), so a model never overflows
before it wraps or saturates the way the hardware does.
"""

import numpy as np

__all__ = ["signed_limits", "wrap", "saturate"]


def signed_limits(width):
    """``(lowest, highest)`` value of a signed ``width``-bit integer."""
    return -(1 << (width - 1)), (1 << (width - 1)) - 1


def wrap(values, width):
    """``values`` reduced to signed ``width``-bit two's complement (what a register keeps).

    A scalar gives an ``int``; an array or list gives an object-dtype NumPy array, element-wise.
    """
    half = 1 << (width - 1)
    if np.ndim(values) == 0:
        return (int(values) + half) % (1 << width) - half
    return (np.asarray(values, dtype=object) + half) % (1 << width) - half


def saturate(value, width):
    """``value`` clamped to the signed ``width``-bit range (an ``int``)."""
    low, high = signed_limits(width)
    return max(low, min(high, int(value)))
