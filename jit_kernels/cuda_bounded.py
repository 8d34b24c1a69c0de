"""CUDA drivers of a bounded table's kernels: :mod:`jit_kernels.bounded` on the GPU.

Same names, arguments and results as :mod:`jit_kernels.bounded` (Numba device
arrays where it takes numpy arrays), and the same bodies: the per-key bodies
(``present_one``, ``restore_one``, ``sync_one``, ``forget_one``) run one thread a
key, and the evicting pass (``_pass``) runs as it does on the CPU, one thread a
sequence of positions:

* :func:`bounded_insert`: one thread runs the whole call in batch order;
* :func:`bounded_insert_ranges` (a full table, or a call that cannot fill it):
  one thread (a block) a range of the index, into a full table one a shifted range
  for the positions the ranges deferred, then one thread the few left, exactly as
  the CPU's ``prange`` over ranges does (a fill's rows are handed out a thread a
  range too); the result depends on the table and the call
  only, so a CUDA bounded table holds the very keys, rows and scores of a CPU
  one given the same calls (``tests/numbaemb/test_cuda_bounded.py`` checks it).

The passes are serial by design (each key's victim depends on the keys placed
before it): a GPU runs up to ``ranges_for(capacity, window)`` threads (1024 at
most) where an unbounded insert runs a thread a key.  Nothing here imports
``numba.cuda`` until a driver is first called.

Example (needs a GPU or the simulator, so not a doctest)::

    taken, n_ev, made, size = bounded_insert_ranges(
        slots, mask, keys, given, scores, mscore, mark, batch, MAX, rows, where, inserted,
        free_rows, n_free, fresh_start, size, ranges_for(cap, 32), limit, 32, LRU, 0, clock,
        True, ev_keys, ev_rows, deferred)
"""
import numpy as np

from . import bounded as kb
from . import bounded_accum as ka
from . import cuda_table as ct
from .bounded_groups import shifted_range as shifted_range_cpu
from .cuda_kernels import registrar
from .slots import first_slot

__all__ = ["find_present", "forget", "restore_scores", "sync_meta", "bounded_insert",
           "bounded_insert_ranges", "absent_count", "init_copy", "rehash_serial", "ranges_for",
           "nonneg", "accum_plan", "accum_apply", "acting_positions", "group_rows"]

ranges_for = kb.ranges_for
cuda = None      # numba.cuda, bound by add_kernels (a global: the simulator swaps it)


def add_kernels(kernels, cuda_module, body, copy_row, init_cols, init_both):
    """Add the bounded kernels (``bounded_*``) to ``kernels`` (called by
    :func:`jit_kernels.cuda_kernels.build`, which passes its row helpers)."""
    global cuda
    cuda = cuda_module
    present_one, forget_one = body(kb.present_one), body(kb.forget_one)
    restore_one, sync_one = body(kb.restore_one), body(kb.sync_one)
    run_pass, home_of = body(kb._pass), body(first_slot)
    shifted_range = body(shifted_range_cpu)
    held_n, spec_n = kb.DEFER_KEYS, kb.SPEC

    kernel = registrar(kernels, "bounded_")

    @kernel
    def present(slots, mask, keys, rows, where, mscore, mark, batch, hold):
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            present_one(slots, mask, keys, rows, where, mscore, mark, batch, hold, i)

    @kernel
    def forget(slots, mask, keys, mscore):
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            forget_one(slots, mask, keys, mscore, i)

    @kernel
    def restore(slots, mask, keys, where, scores, mscore):
        for i in range(cuda.grid(1), where.shape[0], cuda.gridsize(1)):
            restore_one(slots, mask, keys, where, scores, mscore, i)

    @kernel
    def sync(slots, scores, mscore, mark):
        for s in range(cuda.grid(1), mscore.shape[0], cuda.gridsize(1)):
            sync_one(slots, scores, mscore, mark, s)

    @kernel
    def passes(idx, starts, span, off, slots, mask, keys, given, scores, mscore, mark, batch,
               hold, rows, where, inserted, free_rows, n_free, fresh_start, size, limit, window,
               policy, epoch, clock, keep, ev_keys, ev_rows, ev_pos, e_base, deferred, out):
        """Thread g: ``_pass`` over ``idx[starts[g]:starts[g + 1]]``; ``span > 0``: the
        g-th range of ``span`` slots, shifted by ``off`` (evictions from ``e_base +
        starts[g]``)."""
        g = cuda.grid(1)
        if g < starts.shape[0] - 1:
            held = cuda.local.array(held_n, np.int64)
            spec = cuda.local.array(spec_n, np.int64)
            hi = (g + 1) * span + off if span > 0 else -1
            r = run_pass(idx, starts[g], starts[g + 1], slots, mask, keys, given, scores,
                         mscore, mark, batch, hold, rows, where, inserted, free_rows, n_free,
                         fresh_start, size, limit, window, policy, epoch, clock, keep, hi, 0,
                         ev_keys, ev_rows, ev_pos, e_base + starts[g], deferred, held, spec)
            out[g, 0], out[g, 1], out[g, 2], out[g, 3], out[g, 4] = r

    slot_row_one, range_rows = body(kb.slot_row_one), body(kb.range_rows)

    @kernel
    def slot_rows(rows, where, scores, mscore):
        for i in range(cuda.grid(1), rows.shape[0], cuda.gridsize(1)):
            slot_row_one(rows, where, scores, mscore, i)

    @kernel
    def fill_rows(starts, base, slots, rows, where, inserted, deferred, scores, mscore,
                  free_rows, n_free, fresh_start):
        """:func:`jit_kernels.bounded.range_rows`, a thread a range."""
        for g in range(cuda.grid(1), starts.shape[0] - 1, cuda.gridsize(1)):
            range_rows(starts, g, base, slots, rows, where, inserted, deferred, scores, mscore,
                       free_rows, n_free, fresh_start)

    @kernel
    def homes(keys, rows, where, mask, span, home):
        """The range of each position: its slot (present), else its home slot."""
        for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
            home[i] = (where[i] if rows[i] >= 0 else home_of(keys[i], mask)) // span

    plan_group, apply_group = body(ka.plan_group), body(ka.apply_group)

    @kernel
    def accum_plan(order, starts, present, exists, touch):
        for g in range(cuda.grid(1), touch.shape[0], cuda.gridsize(1)):
            plan_group(order, starts, present, exists, touch, g)

    @kernel
    def accum_apply(order, starts, touch, touch_rows, present, values, spill, split, old, new,
                    exists, rows, inserted):
        for g in range(cuda.grid(1), touch.shape[0], cuda.gridsize(1)):
            apply_group(order, starts, touch, touch_rows, present, values, spill, split, old,
                        new, exists, rows, inserted, g)

    @kernel
    def acting(touch, act):
        """``act[p] = p`` for each group's acting position ``p`` (``act`` starts -1)."""
        for g in range(cuda.grid(1), touch.shape[0], cuda.gridsize(1)):
            if touch[g] >= 0:
                act[touch[g]] = touch[g]

    @kernel
    def index_of(pos, at):
        """``at[pos[j]] = j``."""
        for j in range(cuda.grid(1), pos.shape[0], cuda.gridsize(1)):
            at[pos[j]] = j

    @kernel
    def group_rows(touch, at, rows, out):
        """``out[g]`` = the row the insert gave group g's acting position (-1: none)."""
        for g in range(cuda.grid(1), touch.shape[0], cuda.gridsize(1)):
            out[g] = rows[at[touch[g]]] if touch[g] >= 0 else -1

    @kernel
    def nonneg(a, out):
        for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
            out[i] = a[i] >= 0

    @kernel
    def iota(a):
        for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
            a[i] = i

    @kernel
    def to_ranges(order, keys, given, rows, where, k2, g2, r2, w2, late2):
        for t in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
            i = order[t]
            k2[t], g2[t], r2[t], w2[t], late2[t] = keys[i], given[i], rows[i], where[i], False

    @kernel
    def from_ranges(order, r2, w2, new2, late2, rows, where, inserted, deferred, late_pos,
                    code):
        for t in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
            i = order[t]
            rows[i], where[i], inserted[i] = r2[t], w2[t], new2[t]
            deferred[i] = code if late2[t] else 0
            late_pos[i] = i if late2[t] else -1

    @kernel
    def shifted_groups(late, slots, mask, keys, rows, where, mscore, mark, batch, hold,
                       n_ranges, group, deferred):
        """Round two, position late[t]: found again (round one inserted keys), then its
        shifted range g into ``deferred`` and g - 1 into ``group`` (the wrapping half
        ranges: group n_ranges - 1, which no pass runs)."""
        for t in range(cuda.grid(1), late.shape[0], cuda.gridsize(1)):
            i = late[t]
            present_one(slots, mask, keys, rows, where, mscore, mark, batch, hold, i)
            g = shifted_range(mask, keys, rows, where, i, n_ranges)
            deferred[i] = g
            group[t] = g - 1

    @kernel
    def take1(a, idx, out):
        for t in range(cuda.grid(1), idx.shape[0], cuda.gridsize(1)):
            out[t] = a[idx[t]]

    @kernel
    def left_over(late, group, again, n_ranges, deferred, out):
        """out[t] = late[t] where it runs serially (not in a shifted range, or deferred
        again there: its round becomes n_ranges), else -1."""
        for t in range(cuda.grid(1), late.shape[0], cuda.gridsize(1)):
            i = late[t]
            if group[t] == n_ranges - 1 or again[i]:
                deferred[i] = n_ranges
                out[t] = i
            else:
                out[t] = -1

    @kernel
    def eviction_at(ep, starts, e_base, counts, order, at):
        """``at[position] = e`` for the evictions of group g, from ``e_base + starts[g]``
        (``ep[e]``: the evicting position, through ``order`` when it is given, i.e.
        non-empty)."""
        g = cuda.grid(1)
        if g < starts.shape[0] - 1:
            for e in range(e_base + starts[g], e_base + starts[g] + counts[g, 1]):
                at[order[ep[e]] if order.shape[0] else ep[e]] = e

    @kernel
    def take_evicted(sel, ek, er, ev_keys, ev_rows):
        for j in range(cuda.grid(1), sel.shape[0], cuda.gridsize(1)):
            ev_keys[j], ev_rows[j] = ek[sel[j]], er[sel[j]]

    @kernel
    def init_copy(values, spill, split, rows, keys, inserted, present, out, kind, a, b, seed,
                  const, log_t):
        tid = cuda.grid(1)
        lane, lanes = tid & ((1 << log_t) - 1), 1 << log_t
        for i in range(tid >> log_t, keys.shape[0], cuda.gridsize(1) >> log_t):
            r = rows[i]
            if inserted[i]:
                init_both(values[r] if r < split else spill[r - split], out[i], keys[i], kind,
                          a, b, seed, const, lane, lanes)
            elif present[i]:
                copy_row(values[r] if r < split else spill[r - split], out[i], lane, lanes)
            else:
                init_cols(out[i], keys[i], kind, a, b, seed, const, lane, lanes)


# ---- drivers (the names and arguments of jit_kernels.bounded) -----------------------------
def _k():
    return ct._kernels()


def find_present(slots, mask, keys, rows, where, mscore, mark, batch, hold):
    ct._go(_k().bounded_present, keys.shape[0], slots, mask, keys, rows, where, mscore, mark,
           batch, hold)


def forget(slots, mask, keys, mscore):
    ct._go(_k().bounded_forget, keys.shape[0], slots, mask, keys, mscore)


def restore_scores(slots, mask, keys, where, scores, mscore):
    ct._go(_k().bounded_restore, where.shape[0], slots, mask, keys, where, scores, mscore)


def sync_meta(slots, scores, mscore, mark):
    ct._go(_k().bounded_sync, mscore.shape[0], slots, scores, mscore, mark)


def nonneg(a, out):
    """``out[i] = a[i] >= 0`` (which keys were present: their rows)."""
    ct._go(_k().bounded_nonneg, a.shape[0], a, out)


def rehash_serial(old_slots, new_slots, new_mask):
    """The rehash kernel on one thread: keys placed in slot order, as the CPU's serial
    rehash places them (a bounded table's layout decides its evictions)."""
    _k().rehash[1, 1](old_slots, new_slots, new_mask)


# Threads a block of the passes kernel: each thread runs its own serial pass, whose
# branches and loads part from its neighbours' at once, so threads of one warp wait
# on each other's.  A block (a warp) a pass: the ranges of a 100k batch into a full
# 1M-key table took 1.9 ms on an H100 against 6.9 ms at 256 threads a block.
PASS_THREADS = 1


def _run(idx, starts, span, call, e_base, ev, deferred, sc, off=0):
    """Launch ``passes``: a thread per group of ``starts`` (ranges of ``span`` slots
    shifted by ``off``); its per-group results (g, 5) on the host and on the device
    (``sc``'s buffer)."""
    g = starts.shape[0] - 1
    out = sc.array("b_res", 5 * max(g, 1), np.int64).reshape((max(g, 1), 5))
    threads = PASS_THREADS
    blocks = -(-g // threads)
    _k().bounded_passes[max(blocks, 1), threads](idx, starts, span, off, *call, *ev, e_base,
                                                 deferred, out)
    return out.copy_to_host()[:g], out


def _iota(n, sc):
    """``[0, n)`` in ``sc``'s buffer (the whole buffer written when it is made: no
    launch after)."""
    a = sc.array("b_iota", n, np.int64)
    if sc.made:
        whole = sc.whole("b_iota")
        ct._go(_k().bounded_iota, whole.shape[0], whole)
    return a


def _pair(x, y, sc, name):
    """``[x, y]`` in ``sc``'s buffer ``name`` (one copy, no allocation)."""
    a = sc.array(name, 2, np.int64)
    a.copy_to_device(np.array([x, y], np.int64))
    return a


def _scratches(scratch):
    """The three scratches of a call: the passes', round two's, the serial pass's (each
    driver call reuses a buffer name of its own scratch; a shard keeps them from call
    to call, :class:`numbaemb.cuda_bounded.CudaBoundedShard`)."""
    return scratch if scratch is not None else (ct.Scratch(), ct.Scratch(), ct.Scratch())


def bounded_insert(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
                   inserted, free_rows, n_free, fresh_start, size, limit, window, policy,
                   epoch, clock, keep, ev_keys, ev_rows, scratch=None):
    """See :func:`jit_kernels.bounded.bounded_insert` (one GPU thread, batch order).
    ``scratch``: see :func:`_scratches`."""
    sc = _scratches(scratch)[2]
    n = keys.shape[0]
    call = (slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
            inserted, free_rows, n_free, fresh_start, size, limit, window, policy, epoch, clock,
            keep)
    ev = (ev_keys, ev_rows, sc.array("b_ep", n, np.int64))
    res, _ = _run(_iota(n, sc), _pair(0, n, sc, "b_starts"), 0, call, 0, ev,
                  sc.array("b_late", 1, np.bool_), sc)
    taken, n_ev, d_deleted, size, _ = (int(x) for x in res[0])
    return taken, n_ev, d_deleted, size


def bounded_insert_ranges(slots, mask, keys, given, scores, mscore, mark, batch, hold, rows,
                          where, inserted, free_rows, n_free, fresh_start, size, n_ranges, limit,
                          window, policy, epoch, clock, keep, ev_keys, ev_rows, deferred,
                          scratch=None):
    """See :func:`jit_kernels.bounded.bounded_insert_ranges` (a thread a range, a thread
    a shifted range for the deferred positions of a full table, then one thread).
    ``scratch``: see :func:`_scratches`; the call allocates nothing else."""
    K = _k()
    sc, sc2, sc3 = _scratches(scratch)
    n = keys.shape[0]
    fill = size < limit
    span = (mask + 1) // n_ranges
    home = sc.array("b_home", n, np.int64)
    ct._go(K.bounded_homes, n, keys, rows, where, mask, span, home)
    order, starts = ct.group_positions(home, n_ranges, sc)
    k2, g2, r2, w2 = (sc.array(name, n, np.int64) for name in ("b_k2", "b_g2", "b_r2", "b_w2"))
    new2, late2 = sc.array("b_new2", n, np.bool_), sc.array("b_late2", n, np.bool_)
    ct._go(K.bounded_to_ranges, n, order, keys, given, rows, where, k2, g2, r2, w2, late2)
    if fill:
        ct._go(K.bounded_slot_rows, n, r2, w2, scores, mscore)
    ek, er, ep = (sc.array(name, 3 * n, np.int64) for name in ("b_ek", "b_er", "b_ep"))
    no_rows = sc.array("b_no_rows", 1, np.int64)
    call = (slots, mask, k2, g2, mscore if fill else scores, mscore, mark, batch, hold, r2, w2,
            new2, no_rows, -1 if fill else 0, 0, 0 if fill else limit,
            n + 1 if fill else limit, window, policy, epoch, clock, keep)
    res, counts = _run(_iota(n, sc), starts, span, call, 0, (ek, er, ep), late2, sc)
    taken = int(res[:, 0].sum()) if fill else 0
    if fill:                        # the new rows, a thread a range
        base = np.concatenate([[0], np.cumsum(res[:-1, 0])]).astype(np.int64)
        dev_base = sc.array("b_base", n_ranges, np.int64)
        dev_base.copy_to_device(base)
        ct._go(K.bounded_fill_rows, n_ranges, starts, dev_base, slots, r2, w2,
               new2, late2, scores, mscore, free_rows, n_free, fresh_start)
    late_pos = sc.array("b_late_pos", n, np.int64)
    ct._go(K.bounded_from_ranges, n, order, r2, w2, new2, late2, rows, where, inserted,
           deferred, late_pos, n_ranges)
    late = sc.array("b_late", n, np.int64)
    m = ct.compact_nonneg(late_pos, late, scratch=sc)
    late, e3, made2 = late[:m], n, 0
    at = ct.filled(n, -1, np.int64, sc, "b_at")
    if not fill and m and n_ranges > 1:     # round two: the ranges shifted by half a range
        late, made2 = _round_two(late, slots, mask, keys, given, scores, mscore, mark, batch,
                                 hold, rows, where, inserted, n_ranges, limit, window, policy,
                                 epoch, clock, keep, (ek, er, ep), deferred, at, sc2)
        e3 = n + m
    call = (slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
            inserted, free_rows, max(n_free - taken, 0), fresh_start + max(taken - n_free, 0),
            size + taken, limit, window, policy, epoch, clock, keep)
    m3 = late.shape[0]
    res2, counts2 = _run(late, _pair(0, m3, sc3, "b_starts"), 0, call, e3, (ek, er, ep),
                         sc3.array("b_late", 1, np.bool_), sc3)
    _eviction_at(ep, starts, 0, counts, order, at)
    _eviction_at(ep, _pair(0, 0, sc3, "b_zeros"), e3, counts2, sc3.array("b_none", 0, np.int64),
                 at)
    sel = sc.array("b_sel", n, np.int64)
    c = ct.compact_nonneg(at, sel, scratch=sc)
    ct._go(K.bounded_take_evicted, c, sel[:c], ek, er, ev_keys, ev_rows)
    return (taken + int(res2[0, 0]), c, int(res[:, 2].sum() + made2 + res2[0, 2]),
            int(res2[0, 3]))


def _round_two(late, slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where,
               inserted, n_ranges, limit, window, policy, epoch, clock, keep, ev, deferred, at,
               sc):
    """Round two of a full table's ranges (see the CPU's): the deferred positions
    ``late`` (batch order) found again and grouped by shifted range on the device, a
    thread a group; their evictions into ``at``.  Returns the positions left for the
    serial pass (batch order, in ``sc``) and the tombstones made."""
    K = _k()
    n, m, span = keys.shape[0], late.shape[0], (mask + 1) // n_ranges
    group = sc.array("b_group", m, np.int64)
    ct._go(K.bounded_shifted_groups, m, late, slots, mask, keys, rows, where, mscore, mark,
           batch, hold, n_ranges, group, deferred)
    order, starts = ct.group_positions(group, n_ranges, sc)     # the last group: serial
    pos = sc.array("b_pos", m, np.int64)
    ct._go(K.bounded_take1, m, late, order, pos)
    again = ct.filled(n, False, np.bool_, sc, "b_again")
    call = (slots, mask, keys, given, scores, mscore, mark, batch, hold, rows, where, inserted,
            sc.array("b_no_rows", 1, np.int64), 0, 0, limit, limit, window, policy, epoch, clock,
            keep)
    res, counts = _run(pos, starts[:n_ranges], span, call, n, ev, again, sc, off=span // 2)
    _eviction_at(ev[2], starts[:n_ranges], n, counts, sc.array("b_none", 0, np.int64), at)
    left = sc.array("b_left", m, np.int64)
    ct._go(K.bounded_left_over, m, late, group, again, n_ranges, deferred, left)
    rest = sc.array("b_rest", m, np.int64)
    return rest[:ct.compact_nonneg(left, rest, scratch=sc)], int(res[:, 2].sum())


def _eviction_at(ep, starts, e_base, counts, order, at):
    """Launch ``eviction_at``: a thread a group of ``starts``."""
    g = max(1, starts.shape[0] - 1)
    _k().bounded_eviction_at[-(-g // ct._Launch.threads), ct._Launch.threads](
        ep, starts, e_base, counts, order, at)


def absent_count(rows):
    """How many of ``rows`` are negative (keys absent when the call started)."""
    present = ct.cuda.device_array(max(rows.shape[0], 1), np.bool_)[:rows.shape[0]]
    nonneg(rows, present)
    return rows.shape[0] - ct.count_true(present)


def accum_plan(order, starts, present, exists, touch):
    """See :func:`jit_kernels.bounded_accum.accum_plan` (a thread a group)."""
    ct._go(_k().bounded_accum_plan, touch.shape[0], order, starts, present, exists, touch)


def accum_apply(order, starts, touch, touch_rows, present, values, old, new, exists, rows,
                inserted):
    """See :func:`jit_kernels.bounded_accum.accum_apply` (a thread a group)."""
    ct._go(_k().bounded_accum_apply, touch.shape[0], order, starts, touch, touch_rows, present,
           *ct._split(values), old, new, exists, rows, inserted)


def acting_positions(touch, n):
    """The groups' acting positions (``touch`` >= 0) in batch order, and where each
    lands: ``(pos (m,), at (n,))`` with ``at[pos[j]] = j``."""
    cuda, K = ct.cuda, _k()
    act = ct.filled(n, -1, np.int64)
    ct._go(K.bounded_acting, touch.shape[0], touch, act)
    pos = cuda.device_array(max(n, 1), np.int64)
    pos = pos[:ct.compact_nonneg(act, pos)]
    ct._go(K.bounded_index_of, pos.shape[0], pos, act)
    return pos, act


def group_rows(touch, at, rows, out):
    ct._go(_k().bounded_group_rows, touch.shape[0], touch, at, rows, out)


def init_copy(values, rows, keys, inserted, present, out, kind, a, b, seed, const):
    """See :func:`jit_kernels.bounded.init_copy` (``values`` a device array or
    :class:`jit_kernels.cuda_table.SplitRows`)."""
    ct._rows(_k().bounded_init_copy, keys.shape[0], out.shape[1], *ct._split(values), rows,
             keys, inserted, present, out, kind, a, b, seed, const)
