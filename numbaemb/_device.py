"""Where a Variable's arrays live: host (numpy) or a CUDA device (Numba device arrays).

``Variable`` does its array plumbing (argument conversion, output buffers,
scatter/gather between shards) through one of two small backends with the
same methods, so its methods read the same on every device.

>>> parse_device("cpu"), parse_device("cuda"), parse_device("cuda:1")
(None, 0, 1)
"""
import numpy as np

from jit_kernels import cpu_table

from . import _checks
from ._memory import aligned_empty


def parse_device(device):
    """``"cpu"`` -> None, ``"cuda"`` -> 0, ``"cuda:N"`` -> N."""
    if not isinstance(device, str):
        raise TypeError("device must be a str ('cpu', 'cuda' or 'cuda:N'), "
                        f"got {type(device).__name__}")
    name, sep, index = device.strip().lower().partition(":")
    if name == "cpu" and not sep:
        return None
    if name in ("cuda", "gpu"):
        if not sep:
            return 0
        if index.isdigit():
            return int(index)
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


class HostArrays:
    """numpy in, numpy out (outputs 64-byte aligned)."""

    device_id = None

    def keys(self, keys, key_dtype):
        keys = _checks.as_keys(keys, key_dtype)
        return keys, _checks.flat_int64(keys)

    def values(self, values, key_shape, dim, dtype, name):
        return _checks.as_values(values, key_shape, dim, dtype, name)

    def exists(self, exists, key_shape):
        return _checks.as_exists(exists, key_shape)

    def operands(self, values, key_shape, dim, dtype, name):
        """``values`` checked as ``dtype`` values, in the dtype row arithmetic uses
        (float32 for 16-bit floats: exactly their values)."""
        exact = self.values(values, key_shape, dim, dtype, name)
        return exact.astype(_checks.compute_dtype(dtype), copy=False)

    def host(self, a):
        return a

    def positions(self, pos):
        return pos

    def empty(self, shape, dtype):
        return aligned_empty(shape, dtype)

    def from_host(self, a):
        """A numpy result as this side's array (here: itself)."""
        return a

    def take(self, a, pos):
        return a[pos]

    def put(self, out, pos, part):
        out[pos] = part

    def gather(self, values, rows, out):
        cpu_table.gather(values, rows, out)

    def invert(self, flags, out):
        np.logical_not(flags, out=out)

    def concat(self, parts, dtype):
        if len(parts) == 1:   # one shard: its export is already a fresh array, no copy
            return parts[0].astype(dtype, copy=False)
        return np.concatenate(parts).astype(dtype, copy=False)


def _is_device_array(a):
    return bool(getattr(a, "__cuda_ndarray__", False)) or hasattr(a, "__cuda_array_interface__")


class DeviceArrays:
    """numpy or device arrays (CuPy, Numba: anything with ``__cuda_array_interface__``)
    in, Numba device arrays out, on GPU ``device_id``."""

    def __init__(self, device_id):
        from jit_kernels import cuda_table
        self.k = cuda_table
        try:
            self.cuda = cuda_table.cuda_api()
        except ImportError as e:
            raise RuntimeError(f"device 'cuda:{device_id}' needs numba-cuda and a CUDA GPU: {e}") from e
        self.device_id = device_id
        if not self.cuda.is_available():
            raise RuntimeError(f"device 'cuda:{device_id}' needs a CUDA GPU and driver, and none "
                               "was found (NUMBA_ENABLE_CUDASIM=1 runs the CUDA simulator)")
        if not 0 <= device_id < len(self.cuda.gpus):
            raise ValueError(f"device cuda:{device_id} does not exist "
                             f"({len(self.cuda.gpus)} CUDA device(s) visible)")

    def on(self):
        return self.cuda.gpus[self.device_id]

    def _device(self, a, name):
        """``a`` as a C-contiguous Numba device array (no copy), or None for host data."""
        if not _is_device_array(a):
            return None
        if not getattr(a, "__cuda_ndarray__", False):
            a = self.cuda.as_cuda_array(a)
        if a.size and not a.is_c_contiguous():
            raise ValueError(f"{name} on the device must be C-contiguous")
        return a

    def _cast(self, a, dtype):
        """A device copy of ``a`` in ``dtype`` (or ``a`` itself)."""
        if a.dtype == dtype:
            return a
        out = self.cuda.device_array(a.shape, dtype)
        if a.size:
            self.k.cast(a.reshape(-1), out.reshape(-1))
        return out

    def keys(self, keys, key_dtype):
        """``(keys, flat)``: ``keys`` with its shape (host keys stay on the host, where
        the partitioner reads them) and the flat int64 device copy the kernels take."""
        with self.on():
            d = self._device(keys, "keys")
            if d is None:
                keys = _checks.as_keys(keys, key_dtype)
                return keys, self.cuda.to_device(_checks.flat_int64(keys))
            if d.dtype.kind not in "iu":
                raise _checks.DtypeError(f"keys must hold integers ({key_dtype} for this table), "
                                f"got dtype {d.dtype}")
            elif d.dtype != key_dtype and not np.can_cast(d.dtype, key_dtype, "safe"):
                # rare: check the range on the host, as for numpy keys
                d = self.cuda.to_device(_checks.as_keys(d.copy_to_host(), key_dtype))
            d = self._cast(d, key_dtype)
            return d, self._cast(d.reshape(-1), np.dtype(np.int64))

    def values(self, values, key_shape, dim, dtype, name):
        with self.on():
            d = self._device(values, name)
            if d is None:
                arr = _checks.as_values(values, key_shape, dim, dtype, name)
                store = _checks.storage_dtype(arr.dtype)
                if store == arr.dtype:
                    return self.cuda.to_device(arr)
                return self.cuda.to_device(arr.view(store)).view(arr.dtype)   # bfloat16
            if not _checks.is_real(d.dtype):
                raise _checks.DtypeError(f"{name} must hold real numbers ({dtype} for this table), "
                                f"got dtype {d.dtype}")
            want = tuple(key_shape) + (dim,)
            if tuple(d.shape) != want:
                raise ValueError(f"{name} must have shape keys.shape + (dim,) = {want}, "
                                 f"got {tuple(d.shape)}")
            store = _checks.storage_dtype(dtype)
            if store != np.dtype(dtype) and d.dtype != np.dtype(dtype):
                # 16-bit floats from wider ones: rounded into their bits on the device
                out = self.cuda.device_array(d.shape, store)
                if d.size:
                    self.k.narrow(d.reshape(-1), out.reshape(-1))
                return out.view(np.dtype(dtype)).reshape(-1, dim)
            return self._cast(d, np.dtype(dtype)).reshape(-1, dim)

    def operands(self, values, key_shape, dim, dtype, name):
        """As ``HostArrays.operands``, on the device."""
        exact = self.values(values, key_shape, dim, dtype, name)
        store = _checks.storage_dtype(dtype)
        if store == np.dtype(dtype):
            return exact
        with self.on():
            out = self.cuda.device_array(exact.shape, np.float32)
            if exact.size:
                self.k.widen(exact.view(store).reshape(-1), out.reshape(-1))
            return out

    def exists(self, exists, key_shape):
        with self.on():
            d = self._device(exists, "exists")
            if d is None:
                return self.cuda.to_device(_checks.as_exists(exists, key_shape))
            if d.dtype != np.bool_:
                raise _checks.DtypeError(f"exists must be a bool array, got dtype {d.dtype}")
            if tuple(d.shape) != tuple(key_shape):
                raise ValueError(f"exists must have the shape of keys {tuple(key_shape)}, "
                                 f"got {tuple(d.shape)}")
            return d.reshape(-1)

    def host(self, a):
        if isinstance(a, np.ndarray):
            return a
        store = _checks.storage_dtype(a.dtype)
        with self.on():
            if store == a.dtype:
                return a.copy_to_host()
            return a.view(store).copy_to_host().view(a.dtype)   # bfloat16: no buffer format

    def positions(self, pos):
        with self.on():
            return self.cuda.to_device(np.ascontiguousarray(pos, np.int64))

    def empty(self, shape, dtype):
        with self.on():
            return self.cuda.device_array(shape, dtype)

    def from_host(self, a):
        """A numpy result moved to this GPU (results follow the table's device)."""
        with self.on():
            return self.cuda.to_device(a)

    @staticmethod
    def _2d(a):
        return a.reshape(a.shape[0], -1) if a.ndim != 2 else a

    def take(self, a, pos):
        with self.on():
            out = self.cuda.device_array((pos.shape[0],) + tuple(a.shape[1:]), a.dtype)
            if pos.shape[0]:
                self.k.gather(self._2d(a), pos, self._2d(out))
            return out

    def put(self, out, pos, part):
        with self.on():
            if pos.shape[0]:
                self.k.scatter(self._2d(part), pos, self._2d(out))

    def gather(self, values, rows, out):
        with self.on():
            self.k.gather(values, rows, out)

    def invert(self, flags, out):
        with self.on():
            self.k.invert(flags, out)

    def concat(self, parts, dtype):
        with self.on():
            n = sum(p.shape[0] for p in parts)
            out = self.cuda.device_array((n,) + tuple(parts[0].shape[1:]), dtype)
            at = 0
            for p in parts:
                if p.shape[0]:
                    out[at:at + p.shape[0]].copy_to_device(self._cast(p, np.dtype(dtype)))
                at += p.shape[0]
            return out
