"""Initializers: deterministic initial values per (seed, key, column).

Each initializer is a frozen dataclass.  ``params(dim, seed)`` turns it into
the ``(kind, a, b, seed, const)`` tuple the kernels take.  An initializer's own
``seed`` wins over the variable's.  The random kinds draw float32 numbers (a
float64 table holds them exactly), the same bits on the CPU, the GPU and in a
serving graph: :mod:`jit_kernels.initializers`.

>>> import numpy as np, numbaemb as ne
>>> v = ne.Variable(dim=3, initializer=ne.initializers.Constant(0.5))
>>> v.lookup(np.array([7])).tolist()
[[0.5, 0.5, 0.5]]
"""
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import numpy as np

from jit_kernels import initializers as _k

__all__ = ["Initializer", "Zeros", "Constant", "RandomUniform", "RandomNormal",
           "TruncatedNormal", "from_config", "get"]


@dataclass(frozen=True)
class Initializer:
    """Base class. Subclasses set ``kind`` and implement ``_ab``."""

    kind = -1

    def params(self, dim: int, seed: int) -> Tuple[int, float, float, int, np.ndarray]:
        """Kernel parameters ``(kind, a, b, seed, const)`` for a table of width ``dim``
        (``kind`` a :class:`jit_kernels.initializers.Kind`: CPU kernels build that kind's
        initializer only)."""
        own = getattr(self, "seed", None)
        a, b = self._ab()
        return (_k.Kind(self.kind), float(a), float(b),
                _as_seed(seed if own is None else own), self._const(dim))

    def _ab(self):
        return 0.0, 0.0

    def _const(self, dim):
        return np.zeros(max(dim, 1), np.float64)

    def get_config(self) -> dict:
        cfg = asdict(self)
        return {"class_name": type(self).__name__, "config": cfg}


def _as_seed(seed):
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return int(np.int64(np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)))


@dataclass(frozen=True)
class Zeros(Initializer):
    """All zeros (the default, as in TFRA)."""

    kind = _k.ZEROS


@dataclass(frozen=True)
class Constant(Initializer):
    """A scalar, or a vector of shape ``(dim,)`` repeated for every key (a one-element
    vector counts as its scalar and fills the row, as TFRA's default values do)."""

    value: object = 0.0
    kind = _k.CONSTANT

    def __post_init__(self):
        arr = np.asarray(self.value, dtype=np.float64)
        if arr.ndim > 1:
            raise ValueError(f"Constant value must be a scalar or of shape (dim,), got shape {arr.shape}")
        scalar = arr.ndim == 0 or arr.shape == (1,)
        object.__setattr__(self, "value", float(arr.reshape(-1)[0]) if scalar
                           else tuple(arr.tolist()))

    def _const(self, dim):
        if isinstance(self.value, tuple):
            if len(self.value) != dim:
                raise ValueError(f"Constant value has shape ({len(self.value)},) but dim is {dim}")
            return np.asarray(self.value, np.float64)
        return np.full(max(dim, 1), self.value, np.float64)


@dataclass(frozen=True)
class RandomUniform(Initializer):
    """Uniform on ``[minval, maxval)``."""

    minval: float = -0.05
    maxval: float = 0.05
    seed: Optional[int] = None
    kind = _k.UNIFORM

    def __post_init__(self):
        if not self.minval <= self.maxval:
            raise ValueError(f"RandomUniform needs minval <= maxval, got {self.minval} > {self.maxval}")

    def _ab(self):
        return self.minval, self.maxval


@dataclass(frozen=True)
class RandomNormal(Initializer):
    """Normal with ``mean`` and ``stddev``."""

    mean: float = 0.0
    stddev: float = 0.05
    seed: Optional[int] = None
    kind = _k.NORMAL

    def __post_init__(self):
        if not self.stddev >= 0:
            raise ValueError(f"stddev must be >= 0, got {self.stddev}")

    def _ab(self):
        return self.mean, self.stddev


@dataclass(frozen=True)
class TruncatedNormal(RandomNormal):
    """Normal cut at two standard deviations (as Keras), drawn without rejection."""

    kind = _k.TRUNCATED_NORMAL


_CLASSES = {c.__name__: c for c in (Zeros, Constant, RandomUniform, RandomNormal, TruncatedNormal)}


def from_config(cfg: dict) -> Initializer:
    """Inverse of ``Initializer.get_config``."""
    try:
        cls = _CLASSES[cfg["class_name"]]
    except (KeyError, TypeError):
        raise ValueError(f"unknown initializer config {cfg!r}") from None
    return cls(**cfg.get("config", {}))


def get(initializer) -> Initializer:
    """Accept None (zeros), a number or array (constant) or an Initializer."""
    if initializer is None:
        return Zeros()
    if isinstance(initializer, Initializer):
        return initializer
    if isinstance(initializer, (int, float, np.integer, np.floating, list, tuple, np.ndarray)) \
            and not isinstance(initializer, bool):
        return Constant(initializer)
    raise TypeError("initializer must be None, a number, an array of shape (dim,) or a "
                    f"numbaemb.initializers.Initializer, got {type(initializer).__name__}")
