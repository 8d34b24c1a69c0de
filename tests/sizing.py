"""Hypothesis sizes for tests that set their own example counts.

>>> examples(30) >= 30
True
"""
import os

LONG = os.environ.get("NUMBAEMB_LONG") == "1"     # a soak run (README: long runs)


def examples(ci):
    """``ci`` examples in CI, 20 times as many in a soak run (``NUMBAEMB_LONG=1``)."""
    return ci * 20 if LONG else ci
