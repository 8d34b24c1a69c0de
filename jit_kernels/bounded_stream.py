"""A bounded range pass's stream of the next range's index lines
(:func:`jit_kernels.bounded._pass`, range mode).

A pass runs its range's positions in batch order, so the index lines its new keys
touch (about 7 each: the probe's, the window of score copies, the victim's slot and
run) come in at random, one miss at a time.  The same thread runs the next range
next (Numba hands each thread a stretch of consecutive ranges), so the pass
requests that range's lines in order, a few a position, and they come at the
memory's bandwidth instead.

>>> stream_share(4096, 195)     # 1,536 lines of a 4,096-slot range over 195 positions
8
>>> stream_share(4096, 50)      # too few positions to use them: none
0
"""
from ._inner import inner
from .cpu_table import prefetch_later

STREAM_PER = 16      # most lines of the next range a range's position streams in


@inner
def range_lines(n):
    """Cache lines of ``n`` index slots: 16 bytes each in ``slots``, 8 in ``mscore``."""
    return n // 4 + n // 8


@inner
def line_at(lo, n, q):
    """``(array, byte offset)`` of line ``q`` of the index slots ``[lo, lo + n)``:
    ``slots``' lines first (array 0), then ``mscore``'s (array 1)."""
    ls = n // 4
    if q < ls:
        return 0, 16 * lo + 64 * q
    return 1, 8 * lo + 64 * (q - ls)


@inner
def stream_share(stream, n):
    """Lines of the next range's index (``stream`` slots, :func:`range_lines`) each of
    a pass's ``n`` positions requests, or 0: none when that would be more than
    ``STREAM_PER`` a position.  A pass's new keys each touch about 7 random lines of
    their range; with fewer positions than a sixteenth of the range's lines most of a
    streamed range would go unused (measured on a 1M-key table, 512 ranges: a 10k
    batch's passes took 1.9 -> 2.8 ms streaming every range, a 20k batch's 3.5 -> 3.7,
    a 50k batch's 7.2-7.5 -> 6.3-6.8, a 100k batch's 11.8-13.8 -> 11.0-12.5, a 200k
    batch's 23.5 -> 21.3)."""
    if stream <= 0 or n <= 0:
        return 0
    per = (range_lines(stream) + n - 1) // n
    return per if per <= STREAM_PER else 0


@inner
def stream_lines(slots, mscore, lo, n, q0, k):
    """Request lines ``q0 .. q0 + k`` (:func:`line_at`) of the index slots ``[lo, lo +
    n)`` into the second-level cache (a no-op on a GPU)."""
    for q in range(q0, min(q0 + k, range_lines(n))):
        which, off = line_at(lo, n, q)
        if which == 0:
            prefetch_later(slots, off)
        else:
            prefetch_later(mscore, off)
