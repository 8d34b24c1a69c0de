"""Admission filters: an id gets a row only once it has been seen in ``min_count`` calls.

``Variable(dim, admit=CounterFilter(min_count=3))`` (or ``BloomFilter``): every
inserting call (``find_or_insert``, ``upsert``, optimizer steps) first counts the
ids that are not in the table yet, once per call however often a batch repeats
them (so a training step counts an id once, whether it reaches the table through
TensorFlow's summed gradient or through numpy); an id whose count stays below
``min_count`` gets no row: ``find_or_insert`` returns its initial values and
reports it absent, ``upsert`` drops its value, an optimizer step its gradient
(DeepRec's counter and Bloom filters).  Ids already in the table are never
filtered.  Counts live outside the table:

* :class:`CounterFilter`: exact counts in a bounded LRU table of ``capacity`` ids
  (a ``numbaemb.Variable(1, value_dtype=int32, max_capacity=capacity)``, bucketed):
  about 66 bytes per tracked id (index slots at load 1/2 with their digests, the
  count, its score and the score copy); an id pushed out of it (the least recent of
  its bucket) starts again from 0.  An admitted id leaves it.
* :class:`BloomFilter`: a counting Bloom filter of ``m`` one-byte saturating
  counters and ``k`` hashes sized for ``capacity`` ids at ``error_rate``
  (``m = -capacity ln(p) / ln(2)^2``: 9.6 bytes per id at 1%); counts are upper
  bounds (conservative update), so a rare id may be admitted early, never late.
* :class:`RandomFilter`: HierarchicalKV's random admission (SOK's ``filter_ratio``):
  an absent id gets a row with probability ``p`` in each inserting call.  The coin is
  a hash of the id, a seed and the filter's clock (the calls that brought it absent
  ids so far), so a run is reproducible on any device or world size; its state is
  that clock (8 bytes in all).

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=1, admit=CounterFilter(min_count=2))
>>> v.upsert(np.array([7, 7]), np.ones((2, 1)))         # one call: seen once, not admitted
>>> v.size(), v.lookup(np.array([7])).tolist()
(0, [[0.0]])
>>> v.upsert(np.array([7]), np.array([[1.0]]))          # twice: admitted
>>> v.size()
1
"""
import math

import numpy as np
from numba import njit

from jit_kernels.hashing import GOLDEN, hash_key, mix64
from jit_kernels.segment import unique_inverse

from . import _checks

__all__ = ["CounterFilter", "BloomFilter", "RandomFilter", "admitted"]


class CounterFilter:
    """Exact counts of not-yet-admitted ids, in a bounded LRU table (see the module doc).

    Args:
      min_count: occurrences an id needs before it gets a row (>= 1).
      capacity: ids tracked at once (the least recently seen are forgotten).
    """

    def __init__(self, min_count=3, capacity=1 << 20):
        from .variable import Variable
        self.min_count = _checks.positive_int(min_count, "min_count")
        self.capacity = _checks.positive_int(capacity, "capacity")
        self.counts = Variable(1, value_dtype=np.int32, max_capacity=self.capacity)

    def nbytes(self):
        """Bytes of its state: the counts' bounded table."""
        return self.counts.nbytes()

    def count(self, keys):
        """Count this call for every distinct id of ``keys`` (int64, (n,), none admitted
        yet); returns each position's count so far, this call included (int64, (n,))."""
        uniq, inverse = unique_inverse(keys)
        total = self.counts.lookup(uniq)[:, 0].astype(np.int64) + 1
        self.counts.upsert(uniq, np.minimum(total, np.iinfo(np.int32).max)[:, None])
        done = total >= self.min_count
        if done.any():                      # admitted: their counts are not needed again
            self.counts.remove(uniq[done])
        return total[inverse]

    def __repr__(self):
        return f"CounterFilter(min_count={self.min_count}, capacity={self.capacity})"


@njit(nogil=True, cache=True)
def _bloom_count(counters, k, keys, seen, out):
    """Conservative-update counting Bloom filter: each distinct key's estimate (the
    minimum of its ``k`` counters) plus ``seen[i]``, saturating at 255, written back
    to every counter below it; ``out[i]`` = that new estimate."""
    m = np.uint64(counters.shape[0])
    for i in range(keys.shape[0]):
        h = hash_key(keys[i])
        est = 255
        for j in range(k):
            c = counters[np.int64(mix64(h + np.uint64(j + 1) * GOLDEN) % m)]
            est = min(est, np.int64(c))
        new = min(est + seen[i], 255)
        for j in range(k):
            p = np.int64(mix64(h + np.uint64(j + 1) * GOLDEN) % m)
            if counters[p] < new:
                counters[p] = new
        out[i] = new


class BloomFilter:
    """Approximate counts in a counting Bloom filter (see the module doc).

    Args:
      min_count: occurrences an id needs before it gets a row (1..255).
      capacity: ids the filter is sized for.
      error_rate: false-positive rate at ``capacity`` ids (0 < p < 1).
    """

    def __init__(self, min_count=3, capacity=1 << 20, error_rate=0.01):
        self.min_count = _checks.positive_int(min_count, "min_count")
        if self.min_count > 255:
            raise ValueError(f"min_count must be <= 255 for a BloomFilter, got {min_count}")
        self.capacity = _checks.positive_int(capacity, "capacity")
        if not 0.0 < float(error_rate) < 1.0:
            raise ValueError(f"error_rate must be in (0, 1), got {error_rate}")
        self.error_rate = float(error_rate)
        m = max(8, int(math.ceil(-self.capacity * math.log(self.error_rate) / math.log(2) ** 2)))
        self.k = max(1, int(round(m / self.capacity * math.log(2))))
        self.counters = np.zeros(m, np.uint8)

    def nbytes(self):
        """Bytes of its state: the counters."""
        return self.counters.nbytes

    def count(self, keys):
        """As :meth:`CounterFilter.count` (upper bounds, saturating at 255)."""
        uniq, inverse = unique_inverse(keys)
        seen = np.ones(uniq.shape[0], np.int64)
        out = np.empty(uniq.shape[0], np.int64)
        _bloom_count(self.counters, self.k, uniq, seen, out)
        return out[inverse]

    def __repr__(self):
        return (f"BloomFilter(min_count={self.min_count}, capacity={self.capacity}, "
                f"error_rate={self.error_rate})")


@njit(nogil=True, cache=True)
def _coins(keys, seed, clock, limit, out):
    """``out[i]`` = 1 if the coin of ``keys[i]`` in call ``clock`` falls below ``limit``
    (of 2**53), else 0."""
    salt = mix64(np.uint64(seed) + np.uint64(clock) * GOLDEN)
    for i in range(keys.shape[0]):
        out[i] = 1 if (mix64(hash_key(keys[i]) ^ salt) >> np.uint64(11)) < limit else 0


class RandomFilter:
    """Admit an absent id with probability ``p`` in each inserting call (see the
    module doc; HKV's and SOK's ``filter_ratio``).

    Args:
      p: the probability, in (0, 1].
      seed: int >= 0; with the call number it decides every coin.
    """

    min_count = 1

    def __init__(self, p, seed=0):
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) \
                or not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p must be a probability in (0, 1], got {p!r}")
        self.p = float(p)
        self.seed = _checks.positive_int(seed, "seed", minimum=0)
        if self.seed >= 1 << 64:
            raise ValueError(f"seed must be < 2**64 (it salts 64-bit hashes), got {seed}")
        self.clock = 0          # calls that brought absent ids so far

    def nbytes(self):
        """Bytes of its state: its seed and clock."""
        return 16

    def count(self, keys):
        """1 where ``keys`` (int64 (n,), none admitted yet) win this call's coin, else
        0 (a batch's repeats of an id share its coin)."""
        self.clock += 1
        out = np.empty(keys.shape[0], np.int64)
        _coins(keys, self.seed, self.clock, np.uint64(round(self.p * 2.0 ** 53)), out)
        return out

    def __repr__(self):
        return f"RandomFilter(p={self.p}, seed={self.seed})"


def admitted(variable, keys, flat):
    """Positions of ``flat`` (int64 keys, (n,)) that may get a row in ``variable``: the
    ids it holds, and the absent ones whose count reaches the filter's ``min_count``
    (counted here).  None when every position may (no filter, or nothing filtered)."""
    f = getattr(variable, "admit", None)
    if f is None or not flat.shape[0]:
        return None
    host = variable._arrays.host          # (the filter counts on the host)
    present = variable._present(keys, flat)
    absent = np.flatnonzero(~present)
    if not absent.shape[0]:
        return None
    ok = present
    ok[absent] = f.count(host(flat)[absent]) >= f.min_count
    return None if ok.all() else ok


# ---- checkpoints (numbaemb.checkpoint stores these beside the table) -----------------------
def state(f):
    """``(config, arrays)`` of filter ``f``: a JSON-able dict and named int arrays."""
    if isinstance(f, BloomFilter):
        return ({"kind": "bloom", "min_count": f.min_count, "capacity": f.capacity,
                 "error_rate": f.error_rate}, {"counters": f.counters})
    if isinstance(f, RandomFilter):
        return {"kind": "random", "p": f.p, "seed": f.seed, "clock": f.clock}, {}
    if isinstance(f, CounterFilter):
        keys, counts = f.counts.export()
        shard = f.counts.shards[0]
        scores = shard.columns["score"].data[shard.find_rows(keys), 0]
        return ({"kind": "counter", "min_count": f.min_count, "capacity": f.capacity,
                 "clock": int(f.counts._clock)},
                {"keys": keys.astype(np.int64), "counts": counts[:, 0].astype(np.int64),
                 "scores": scores.astype(np.int64)})
    raise TypeError(f"cannot checkpoint admission filter {type(f).__name__}")


def config_of(f):
    """The settings of filter ``f`` as a JSON-able dict (no counts), e.g. for a Keras
    layer's config; :func:`from_config` makes an empty filter of them."""
    config = dict(state(f)[0]) if isinstance(f, (BloomFilter, RandomFilter)) else {
        "kind": "counter", "min_count": f.min_count, "capacity": f.capacity}
    config.pop("clock", None)
    return config


def from_config(config):
    """An empty filter of the settings :func:`config_of` gave; ValueError if unknown."""
    kind = config.get("kind") if isinstance(config, dict) else None
    if kind == "bloom":
        return BloomFilter(config["min_count"], config["capacity"], config["error_rate"])
    if kind == "counter":
        return CounterFilter(config["min_count"], config["capacity"])
    if kind == "random":
        return RandomFilter(config["p"], config["seed"])
    raise ValueError(f"admit: an admission filter config must be a dict with kind 'counter', "
                     f"'bloom' or 'random', got {config!r}")


def merge(filters, keep=None):
    """One filter holding the counts of ``filters`` (of one kind and configuration): a
    table's filters from several checkpoint parts, loaded into another split.  Bloom
    counters add up (saturating: counts stay upper bounds); a counter filter takes the
    union of the tracked ids that ``keep(keys) -> bool mask`` keeps (counts of an id
    tracked twice add up), the most recently counted ones when over its capacity."""
    states = [state(f) for f in filters]
    config = dict(states[0][0])
    if any({k: v for k, v in c.items() if k != "clock"} !=
           {k: v for k, v in config.items() if k != "clock"} for c, _ in states):
        raise ValueError("the admission filters to merge differ in kind or configuration")
    if config["kind"] == "random":      # the ranks count the same calls: the latest
        return from_state(dict(config, clock=max(int(c["clock"]) for c, _ in states)), {})
    if config["kind"] == "bloom":
        total = np.sum([a["counters"].astype(np.int64) for _, a in states], axis=0)
        return from_state(config, {"counters": np.minimum(total, 255).astype(np.uint8)})
    keys, counts, scores = (np.concatenate([a[n] for _, a in states])
                            for n in ("keys", "counts", "scores"))
    if keep is not None:
        mask = keep(keys)
        keys, counts, scores = keys[mask], counts[mask], scores[mask]
    uniq, inverse = np.unique(keys, return_inverse=True)
    total, best = np.zeros(uniq.shape[0], np.int64), np.zeros(uniq.shape[0], np.int64)
    np.add.at(total, inverse, counts)
    np.maximum.at(best, inverse, scores)
    if uniq.shape[0] > config["capacity"]:
        top = np.argsort(best, kind="stable")[-config["capacity"]:]
        uniq, total, best = uniq[top], total[top], best[top]
    config["clock"] = max(int(c["clock"]) for c, _ in states)
    return from_state(config, {"keys": uniq, "counts": np.minimum(total, np.iinfo(np.int32).max),
                               "scores": best})


def from_state(config, arrays):
    """The filter that :func:`state` described; ValueError if it does not fit."""
    kind = config.get("kind")
    if kind == "bloom":
        f = BloomFilter(config["min_count"], config["capacity"], config["error_rate"])
        counters = np.asarray(arrays["counters"])
        if counters.shape != f.counters.shape:
            raise ValueError("Bloom filter counters do not match its configuration")
        f.counters[:] = counters
        return f
    if kind == "random":
        f = RandomFilter(config["p"], config["seed"])
        f.clock = _checks.positive_int(config["clock"], "clock", minimum=0)
        return f
    if kind == "counter":
        f = CounterFilter(config["min_count"], config["capacity"])
        keys, counts, scores = (np.asarray(arrays[n], np.int64)
                                for n in ("keys", "counts", "scores"))
        if not keys.shape == counts.shape == scores.shape or keys.shape[0] > f.capacity:
            raise ValueError("counter filter state does not match its configuration")
        f.counts.upsert(keys, counts[:, None])
        shard = f.counts.shards[0]
        shard.columns["score"].data[shard.find_rows(keys), 0] = scores
        shard._loaded()
        f.counts._clock = max(int(config["clock"]), int(scores.max()) if scores.size else 0)
        return f
    raise ValueError(f"unknown admission filter kind {kind!r}")
