"""``Variable.nbytes()``: the bytes of every array a table holds, summed from the arrays
themselves (index, free rows, columns, a bounded table's score copies and marks, a
string table's names, an admission filter's state)."""
import numpy as np

import numbaemb as ne


def arrays(v):
    """Bytes of the arrays the shards hold, counted here independently."""
    n = 0
    for s in v.shards:
        n += s.slots.nbytes + s.free_rows.nbytes + sum(c.data.nbytes for c in s.columns.values())
        n += sum(getattr(s, a).nbytes for a in ("mscore", "mark") if hasattr(s, a))
    return n


def test_nbytes_counts_every_array_and_grows_with_the_table():
    v = ne.Variable(8, num_shards=3)
    empty = v.nbytes()
    assert empty == arrays(v) > 0
    keys = np.concatenate([np.arange(-50_000, 50_000), np.iinfo(np.int64).min + np.arange(3)])
    v.find_or_insert(keys)
    assert v.nbytes() == arrays(v) >= keys.size * (8 + 8 * 4)
    before = v.nbytes()
    ne.optimizers.apply_gradients(v, ne.optimizers.Adam(), keys[:10], np.ones((10, 8)), step=1)
    slots = sum(s.columns["Adam/m"].data.nbytes + s.columns["Adam/v"].data.nbytes
                for s in v.shards)
    assert v.nbytes() == arrays(v) and v.nbytes() - before >= slots > 0


def test_bounded_tables_count_their_index_up_front():
    v = ne.Variable(4, max_capacity=1 << 16, evict="lfu")
    sh = v.shards[0]
    assert sh.capacity == 1 << 17                       # 2 slots a key of the bound
    assert v.nbytes() == arrays(v) >= sh.capacity * (16 + 8 + 1)     # 25 bytes a slot


def test_names_and_filters_are_counted():
    s = ne.Variable(2, key_dtype="string")
    plain = s.nbytes()
    s.find_or_insert(np.array([b"x" * 1000, b"y" * 1000], object))
    assert s.nbytes() - arrays(s) == s.names.nbytes >= 2000 and s.nbytes() > plain
    for f in (ne.admission.BloomFilter(2, 1000, 0.01), ne.admission.CounterFilter(2, 100),
              ne.admission.RandomFilter(0.5)):
        v = ne.Variable(2, admit=f)
        v.find_or_insert(np.arange(50))
        assert v.nbytes() == arrays(v) + f.nbytes() and f.nbytes() > 0
