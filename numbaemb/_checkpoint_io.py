"""How :mod:`numbaemb.checkpoint` moves a shard's rows between its memory and host
buffers: ``_HostIO`` for a CPU :class:`~numbaemb.shard.Shard`, ``_CudaIO`` for a
:class:`~numbaemb.cuda_shard.CudaShard` (device memory, or split with mapped host
memory).  Chunks are ``checkpoint.CHUNK_BYTES`` at most (read at each call).
"""
import contextlib

import numpy as np

from jit_kernels import cpu_table as k

from .shard import Shard


def _chunk_rows(width, itemsize):
    from . import checkpoint         # (its CHUNK_BYTES, which tests set)
    return checkpoint._chunk_rows(width, itemsize)


def _pairs(keys, first_row):
    """The (key, row) pairs of ``keys`` at rows ``first_row, first_row + 1, ...``, as
    the index's rehash kernels take them (one int64 array)."""
    pairs = np.empty(2 * keys.shape[0], np.int64)
    pairs[0::2] = keys
    pairs[1::2] = np.arange(first_row, first_row + keys.shape[0])
    return pairs


class _HostIO:
    """Moves rows between a CPU :class:`~numbaemb.shard.Shard` and host buffers."""

    def __init__(self, shard):
        self.shard = shard

    def context(self):
        return contextlib.nullcontext()

    def export_rows(self):
        """(host keys, rows in the shard's memory) of every key."""
        return self.shard.export_rows()

    def column_chunks(self, name, rows):
        """Rows ``rows`` of column ``name`` as host chunks of at most CHUNK_BYTES."""
        data = self.shard.columns[name].data
        step = _chunk_rows(data.shape[1], data.dtype.itemsize)
        buf = np.empty((min(rows.shape[0], step), data.shape[1]), data.dtype)
        for i in range(0, rows.shape[0], step):
            out = buf[:min(step, rows.shape[0] - i)]
            k.gather(data, rows[i:i + step], out)
            yield out

    def bulk_insert(self, keys, first_row):
        """Index ``keys`` at rows ``first_row, first_row + 1, ...``; returns the rows
        the index then finds for them (all as host arrays)."""
        self.shard._place(_pairs(keys, first_row), self.shard.slots)
        return self.shard.find_rows(keys)

    def rows_view(self, name, row0, n):
        """Host memory of rows ``[row0, row0 + n)`` of column ``name`` (read straight
        into), or None where the column does not live in host memory."""
        return self.shard.columns[name].data[row0:row0 + n]

    def put_rows(self, name, row0, chunk):
        self.shard.columns[name].data[row0:row0 + chunk.shape[0]] = chunk

    def init_rows(self, name, row0, keys):
        col = self.shard.columns[name]
        k.init_rows(col.data, np.arange(row0, row0 + keys.shape[0]), keys,
                    np.ones(keys.shape[0], np.bool_), *col.init)


class _CudaIO(_HostIO):
    """The same for a :class:`~numbaemb.cuda_shard.CudaShard` (columns in device
    memory, or split between device and mapped host memory)."""

    def __init__(self, shard):
        from jit_kernels import cuda_table
        super().__init__(shard)
        self.ct, self.cuda = cuda_table, cuda_table.cuda_api()

    def context(self):
        return self.shard.on()

    def export_rows(self):
        keys, rows = self.shard.export_rows()
        return keys.copy_to_host(), rows

    def column_chunks(self, name, rows):
        data = self.shard.columns[name].data
        width, dtype = data.shape[1], np.dtype(data.dtype)
        step = _chunk_rows(width, dtype.itemsize)
        m = min(rows.shape[0], step)
        dev = self.cuda.device_array((max(m, 1), width), dtype)
        host = self.cuda.pinned_array((max(m, 1), width), dtype)
        for i in range(0, rows.shape[0], step):
            n = min(step, rows.shape[0] - i)
            self.ct.gather(data, rows[i:i + n], dev[:n])
            dev[:n].copy_to_host(host[:n])
            yield host[:n]

    def bulk_insert(self, keys, first_row):
        self.shard._place(self.shard.to_device(_pairs(keys, first_row)), self.shard.slots)
        return self.shard.find_rows(self.shard.to_device(keys)).copy_to_host()

    def rows_view(self, name, row0, n):
        return None

    def put_rows(self, name, row0, chunk):
        """Rows ``[row0, row0 + len(chunk))`` = chunk, across a SplitRows boundary too."""
        data = self.shard.columns[name].data
        n = chunk.shape[0]
        if isinstance(data, self.ct.SplitRows):
            parts = [(0, data.split, data.head, False), (data.split, data.shape[0], data.tail, True)]
        else:
            parts = [(0, data.shape[0], data, False)]
        for lo, hi, arr, on_host in parts:
            a, b = max(row0, lo), min(row0 + n, hi)
            if a < b:
                piece = np.ascontiguousarray(chunk[a - row0:b - row0])
                if on_host:
                    arr[a - lo:b - lo] = piece
                else:
                    arr[a - lo:b - lo].copy_to_device(piece)

    def init_rows(self, name, row0, keys):
        col = self.shard.columns[name]
        to = self.shard.to_device
        self.ct.init_rows(col.data, to(np.arange(row0, row0 + keys.shape[0])), to(keys),
                          to(np.ones(keys.shape[0], np.bool_)), *col.init)


def _io(shard):
    """The mover for ``shard``: a CPU or a CUDA shard's."""
    return _HostIO(shard) if isinstance(shard, Shard) else _CudaIO(shard)
