"""Input validation: every public call checks its arguments here before touching a table."""
import os

import numpy as np

KEY_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


class DtypeError(TypeError, ValueError):
    """Keys, values or a dtype argument of the wrong dtype.  Both a ``TypeError`` (what a
    wrong type is in Python) and a ``ValueError`` (what TFRA raises, and its tests expect),
    so ``except`` clauses written for either catch it."""

    # Exception's own constructor: TF's autograph then re-raises it as itself when it
    # rises while a tf.function traces, instead of wrapping it in a StagingError
    __init__ = Exception.__init__


class class_only(classmethod):
    """A ``classmethod`` that makes a new object and refuses a call on an instance,
    where it would look like an in-place call and leave the instance as it was
    (``v.load(path)``: the loaded table is thrown away).

    >>> class T:
    ...     @class_only
    ...     def load(cls, path):
    ...         return cls()
    >>> isinstance(T.load("p"), T)
    True
    >>> T().load("p")
    Traceback (most recent call last):
    TypeError: T.load makes a new T and leaves this one as it was: call it on the class, t = T.load(...)
    """

    def __get__(self, obj, cls=None):
        if obj is None:
            return super().__get__(obj, cls)
        name, kind = self.__func__.__name__, type(obj).__name__

        def refuse(*args, **kwargs):
            raise TypeError(f"{kind}.{name} makes a new {kind} and leaves this one as it "
                            f"was: call it on the class, {kind[0].lower()} = "
                            f"{kind}.{name}(...)")
        return refuse


def _bfloat16():
    """``ml_dtypes.bfloat16`` (the NumPy bfloat16 of TensorFlow and JAX), or None."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


BFLOAT16 = _bfloat16()
# 16-bit floats: stored as their bits (jit_kernels.halfs), computed in float32
HALF_DTYPES = (np.dtype(np.float16),) + ((BFLOAT16,) if BFLOAT16 is not None else ())
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64)) + HALF_DTYPES
INT_VALUE_DTYPES = (np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64))
VALUE_DTYPES = FLOAT_DTYPES + INT_VALUE_DTYPES     # integer tables: id maps, counters


def storage_dtype(dt) -> np.dtype:
    """The dtype of the columns that hold values of ``dt``: the bits of 16-bit floats
    (uint16 for float16, int16 for bfloat16, see :mod:`jit_kernels.halfs`), else ``dt``."""
    dt = np.dtype(dt)
    if dt == np.float16:
        return np.dtype(np.uint16)
    if BFLOAT16 is not None and dt == BFLOAT16:
        return np.dtype(np.int16)
    return dt


def compute_dtype(dt) -> np.dtype:
    """The dtype optimizer math and gradients use for values of ``dt`` (float32 for
    16-bit floats)."""
    dt = np.dtype(dt)
    return np.dtype(np.float32) if dt in HALF_DTYPES else dt


def storage_compute_dtype(store) -> np.dtype:
    """The compute dtype of a column stored as ``store`` (16-bit float bits: float32)."""
    store = np.dtype(store)
    return np.dtype(np.float32) if store in (np.dtype(np.uint16), np.dtype(np.int16)) else store


def is_real(dt) -> bool:
    """Integers and floats, bfloat16 included (NumPy files it under kind ``V``)."""
    dt = np.dtype(dt)
    return dt.kind in "fiu" or dt in HALF_DTYPES


# string keys (``numbaemb.string_keys``): the key dtype is numpy's object dtype, spelt
# "string" in configs and checkpoints
STRING = np.dtype(object)
_STRING_NAMES = ("string", "str", "bytes", "object")


def key_dtype(dtype) -> np.dtype:
    """int64, int32 or :data:`STRING` (``"string"``, ``str``, ``bytes``, numpy ``S``/``U``/``O``)."""
    if isinstance(dtype, str) and dtype.lower() in _STRING_NAMES:
        return STRING
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise DtypeError(f"key_dtype must be int64, int32 or string, got {dtype!r}") from None
    if dt.kind in "SUO":
        return STRING
    if dt not in KEY_DTYPES:
        raise DtypeError(f"key_dtype must be int64, int32 or string, got {dt}")
    return dt


def dtype_name(dt) -> str:
    """A key dtype's name in configs: ``"string"`` for string keys."""
    return "string" if dt == STRING else np.dtype(dt).name


def value_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype == "bfloat16" and BFLOAT16 is None:
        raise DtypeError("value_dtype bfloat16 needs the ml_dtypes package (NumPy's bfloat16, "
                         "installed with TensorFlow or JAX): pip install ml_dtypes")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise DtypeError(f"value_dtype must be one of {_names(VALUE_DTYPES)}, got "
                         f"{dtype!r}") from None
    if dt not in VALUE_DTYPES:
        raise DtypeError(f"value_dtype must be one of {_names(VALUE_DTYPES)}, got {dt}")
    return dt


def _names(dtypes):
    return [d.name for d in dtypes]


def as_path(path, name="path") -> str:
    """``path`` (str, bytes or os.PathLike) as a str; a TypeError naming ``name`` else."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"{name} must be a str, bytes or os.PathLike file name, got "
                        f"{type(path).__name__}") from None
    path = os.fsdecode(path) if isinstance(path, bytes) else path
    if not path:
        raise ValueError(f"{name} must name a file, got an empty string")
    return path


def positive_int(value, name, minimum=1) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def as_keys(keys, dtype: np.dtype, name="keys") -> np.ndarray:
    """``keys`` as an array of ``dtype`` (any shape); raises if a value would lose bits."""
    if isinstance(keys, (list, tuple)) and len(keys) == 0:
        return np.empty(0, dtype)
    arr = np.asarray(keys)
    if arr.dtype == object:     # numpy keeps Python ints past 64 bits as objects
        _check_object_ints(arr, dtype, name)
    if arr.dtype.kind not in "iu":
        raise DtypeError(f"{name} must hold integers ({dtype} for this table), got dtype {arr.dtype}")
    if arr.dtype != dtype:
        _check_int_range(arr, dtype, name, "key range")
        arr = arr.astype(dtype)
    return arr


def _check_object_ints(arr, dtype, name):
    """The key-range error for an object array of ints, one of them out of range (an
    object array is refused for its dtype otherwise, by the caller)."""
    ints = all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
               for x in arr.flat)
    if ints and arr.size:
        _check_bounds(min(arr.flat), max(arr.flat), dtype, name, "key range")


def _check_int_range(arr, dtype, name, what="range"):
    """ValueError when integer ``arr`` holds values that ``dtype`` cannot represent."""
    if arr.size and not np.can_cast(arr.dtype, dtype, "safe"):
        _check_bounds(arr.min(), arr.max(), dtype, name, what)


def _check_bounds(lo, hi, dtype, name, what):
    info = np.iinfo(dtype)
    if int(lo) < info.min or int(hi) > info.max:
        raise ValueError(f"{name} holds values outside the {dtype} {what} "
                         f"[{info.min}, {info.max}]: min {lo}, max {hi}")


def flat_int64(keys: np.ndarray) -> np.ndarray:
    """The int64, C-contiguous, 1-D view or copy that kernels take."""
    return np.ascontiguousarray(keys.reshape(-1), dtype=np.int64)


def as_values(values, key_shape, dim, dtype, name="values", shape_of="keys") -> np.ndarray:
    """``values`` as a C-contiguous ``(n, dim)`` array of ``dtype``; checks the shape
    (``key_shape``: the shape of the argument ``shape_of``)."""
    arr = np.asarray(values)
    if not is_real(arr.dtype):
        raise DtypeError(f"{name} must hold real numbers ({dtype} for this table), got dtype {arr.dtype}")
    if np.dtype(dtype).kind == "i":     # an integer table: no truncation, no wrap-around
        if arr.dtype.kind == "f" and arr.size:
            raise DtypeError(f"{name} must hold integers ({dtype} for this table), got dtype "
                             f"{arr.dtype}")
        _check_int_range(arr, dtype, name)
    want = tuple(key_shape) + (dim,)
    if arr.shape != want:
        raise ValueError(f"{name} must have shape {shape_of}.shape + (dim,) = {want}, got "
                         f"{arr.shape}")
    return np.ascontiguousarray(arr, dtype=dtype).reshape(-1, dim)


def as_inverse(inverse, n_ids, name="inverse") -> np.ndarray:
    """``inverse`` (any shape) of ints in ``[0, n_ids)``: positions -> index of their id.
    Returns it as C-contiguous int64 of the same shape."""
    arr = np.asarray(inverse)
    if arr.dtype.kind not in "iu":
        raise DtypeError(f"{name} must hold integers (indices into ids), got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= n_ids):
        raise ValueError(f"{name} must hold indices in [0, {n_ids}) (one per position, into "
                         f"the {n_ids} ids), got values in [{arr.min()}, {arr.max()}]")
    return np.ascontiguousarray(arr, np.int64)


def as_exists(exists, key_shape, name="exists") -> np.ndarray:
    arr = np.asarray(exists)
    if arr.dtype != np.bool_:
        raise DtypeError(f"{name} must be a bool array, got dtype {arr.dtype}")
    if arr.shape != tuple(key_shape):
        raise ValueError(f"{name} must have the shape of keys {tuple(key_shape)}, got {arr.shape}")
    return np.ascontiguousarray(arr).reshape(-1)
