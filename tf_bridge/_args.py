"""Argument checks shared by the TFRA / SOK / DeepRec-named front ends."""
import numpy as np


def int_at_least(value, name, minimum=1):
    """``value`` as an int ``>= minimum``; ValueError naming ``name`` otherwise (the error
    TFRA's and SOK's constructors raise for sizes and counts).

    >>> int_at_least(np.int64(3), "dim")
    3
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)
