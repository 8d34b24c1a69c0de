"""Per-row optimizer bodies and CPU drivers against a NumPy oracle of Keras 3's formulas."""
import numpy as np
import pytest

from jit_kernels import optimizers as k


# ---- NumPy oracle: one dense step on (n, d) arrays, written from keras/src/optimizers ----
def naive_sgd(w, s, g, lr, momentum=0.0, nesterov=False):
    if momentum == 0:
        w -= lr * g
        return
    s["momentum"][:] = s["momentum"] * momentum - g * lr
    w += s["momentum"] * momentum - g * lr if nesterov else s["momentum"]


def naive_adagrad(w, s, g, lr, epsilon=1e-7):
    s["accumulator"] += np.square(g)
    w -= lr * g / np.sqrt(s["accumulator"] + epsilon)


def step_size(lr, beta_1, beta_2, step):
    return lr * np.sqrt(1 - beta_2 ** step) / (1 - beta_1 ** step)


def naive_adam(w, s, g, lr, step, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False):
    alpha = step_size(lr, beta_1, beta_2, step)
    s["m"] += (g - s["m"]) * (1 - beta_1)
    s["v"] += (np.square(g) - s["v"]) * (1 - beta_2)
    v = s["v"]
    if amsgrad:
        s["vhat"][:] = np.maximum(s["vhat"], s["v"])
        v = s["vhat"]
    w -= s["m"] * alpha / (np.sqrt(v) + epsilon)


def naive_ftrl(w, s, g, lr, lr_power=-0.5, l1=0.0, l2=0.0, l2s=0.0, beta=0.0):
    acc, lin = s["accumulator"], s["linear"]
    l2 = l2 + beta / (2.0 * lr)
    new_acc = acc + np.square(g)
    lin += g + 2 * l2s * w - (new_acc ** -lr_power - acc ** -lr_power) / lr * w
    quadratic = new_acc ** -lr_power / lr + 2 * l2
    w[:] = (np.clip(lin, -l1, l1) - lin) / quadratic
    acc[:] = new_acc


def naive_rmsprop(w, s, g, lr, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False):
    s["velocity"][:] = rho * s["velocity"] + (1 - rho) * np.square(g)
    if centered:
        s["average_gradient"][:] = rho * s["average_gradient"] + (1 - rho) * g
        den = s["velocity"] - np.square(s["average_gradient"]) + epsilon
    else:
        den = s["velocity"] + epsilon
    inc = lr * g / np.sqrt(den)
    if momentum > 0:
        s["momentum"][:] = momentum * s["momentum"] + inc
        w -= s["momentum"]
    else:
        w -= inc


# (oracle, slot names and initial values, driver call, hyper-parameters)
# ``start``: the driver's fresh / w0 / s0 keywords (new rows started in the pass)
def _sgd(v, s, rows, g, lr, step, start=None, **h):
    k.sgd_rows(v, s.get("momentum", v), rows, g, lr, h.get("momentum", 0.0),
               h.get("nesterov", False), **(start or {}))


def _adagrad(v, s, rows, g, lr, step, start=None, **h):
    k.adagrad_rows(v, s["accumulator"], rows, g, lr, h.get("epsilon", 1e-7), **(start or {}))


def _adam(v, s, rows, g, lr, step, start=None, **h):
    b1, b2 = h.get("beta_1", 0.9), h.get("beta_2", 0.999)
    k.adam_rows(v, s["m"], s["v"], s.get("vhat", v), rows, g, step_size(lr, b1, b2, step),
                b1, b2, h.get("epsilon", 1e-7), h.get("amsgrad", False), **(start or {}))


def _ftrl(v, s, rows, g, lr, step, start=None, **h):
    k.ftrl_rows(v, s["accumulator"], s["linear"], rows, g, lr, h.get("lr_power", -0.5),
                h.get("l1", 0.0), h.get("l2", 0.0), h.get("l2s", 0.0), h.get("beta", 0.0),
                **(start or {}))


def _rmsprop(v, s, rows, g, lr, step, start=None, **h):
    k.rmsprop_rows(v, s["velocity"], s.get("momentum", v), s.get("average_gradient", v), rows, g,
                   lr, h.get("rho", 0.9), h.get("momentum", 0.0), h.get("epsilon", 1e-7),
                   h.get("centered", False), **(start or {}))


CASES = {
    "sgd": (naive_sgd, {}, _sgd, {}),
    "sgd_momentum": (naive_sgd, {"momentum": 0.0}, _sgd, {"momentum": 0.9}),
    "sgd_nesterov": (naive_sgd, {"momentum": 0.0}, _sgd, {"momentum": 0.5, "nesterov": True}),
    "adagrad": (naive_adagrad, {"accumulator": 0.1}, _adagrad, {"epsilon": 1e-3}),
    "adam": (naive_adam, {"m": 0.0, "v": 0.0}, _adam, {"beta_1": 0.8, "epsilon": 1e-3}),
    "amsgrad": (naive_adam, {"m": 0.0, "v": 0.0, "vhat": 0.0}, _adam, {"amsgrad": True}),
    "ftrl": (naive_ftrl, {"accumulator": 0.1, "linear": 0.0}, _ftrl, {}),
    "ftrl_reg": (naive_ftrl, {"accumulator": 0.5, "linear": 0.0}, _ftrl,
                 {"lr_power": -0.7, "l1": 0.05, "l2": 0.1, "l2s": 0.02, "beta": 0.3}),
    "rmsprop": (naive_rmsprop, {"velocity": 0.0}, _rmsprop, {"rho": 0.8}),
    "rmsprop_momentum": (naive_rmsprop, {"velocity": 0.0, "momentum": 0.0}, _rmsprop,
                         {"momentum": 0.7}),
    "rmsprop_centered": (naive_rmsprop, {"velocity": 0.0, "momentum": 0.0,
                                         "average_gradient": 0.0}, _rmsprop,
                         {"momentum": 0.3, "centered": True, "epsilon": 1e-2}),
}


def _naive_call(oracle, w, s, g, lr, step, h):
    if oracle is naive_adam:
        return oracle(w, s, g, lr, step, **h)
    return oracle(w, s, g, lr, **h)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_driver_matches_oracle_on_the_rows_it_is_given(name, dtype):
    oracle, slots, driver, h = CASES[name]
    rng = np.random.default_rng(0)
    cap, d = 50, 6
    rows = rng.permutation(cap)[:20].astype(np.int64)        # distinct, unordered, a subset
    values = rng.standard_normal((cap, d)).astype(dtype)
    s = {n: np.full((cap, d), init, dtype) for n, init in slots.items()}
    want_w = values[rows].astype(np.float64)
    want_s = {n: a[rows].astype(np.float64) for n, a in s.items()}
    untouched = np.setdiff1d(np.arange(cap), rows)
    before = values[untouched].copy(), {n: a[untouched].copy() for n, a in s.items()}
    for step in range(1, 6):
        g = rng.standard_normal((rows.shape[0], d)).astype(dtype)
        driver(values, s, rows, g, 0.05, step, **h)
        _naive_call(oracle, want_w, want_s, g.astype(np.float64), 0.05, step, h)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(values[rows], want_w, **tol)
    for n in slots:
        np.testing.assert_allclose(s[n][rows], want_s[n], **tol)
    np.testing.assert_array_equal(values[untouched], before[0])
    for n in slots:
        np.testing.assert_array_equal(s[n][untouched], before[1][n])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fresh_rows_start_in_the_update_pass(name, dtype):
    """``fresh`` rows get weights ``w0`` and slots ``s0`` and then their update: the
    same bits as starting them first (as separate writes) and updating after."""
    oracle, slots, driver, h = CASES[name]
    rng = np.random.default_rng(1)
    cap, d, n = 40, 5, 16
    rows = rng.permutation(cap)[:n].astype(np.int64)
    fresh = rng.random(n) < 0.5
    w0 = rng.standard_normal((n, d)).astype(dtype)
    g = rng.standard_normal((n, d)).astype(dtype)
    garbage = rng.standard_normal((cap, d)).astype(dtype)     # what a new row held before
    values = garbage.copy()
    s = {k_: np.full((cap, d), 7.0, dtype) for k_ in slots}
    s0 = tuple(slots.values())
    for k_, init in slots.items():
        s[k_][rows[~fresh]] = init + 0.25
    want_v, want_s = values.copy(), {k_: a.copy() for k_, a in s.items()}
    want_v[rows[fresh]] = w0[fresh]
    for k_, init in slots.items():
        want_s[k_][rows[fresh]] = init
    driver(want_v, want_s, rows, g, 0.05, 3, **h)
    driver(values, s, rows, g, 0.05, 3, start=dict(fresh=fresh, w0=w0, s0=s0), **h)
    np.testing.assert_array_equal(values, want_v)
    for k_ in slots:
        np.testing.assert_array_equal(s[k_], want_s[k_])


def test_row_bodies_update_one_row_in_place():
    w, m, v = np.array([1.0, -2.0]), np.zeros(2), np.zeros(2)
    alpha = step_size(0.1, 0.9, 0.999, 1)
    k.adam_row(w, m, v, v, np.array([0.5, 0.0]), alpha, 0.9, 0.999, 1e-7, False)
    # first Adam step moves by ~lr * sign(g); zero gradient leaves the element alone
    np.testing.assert_allclose(w, [0.9, -2.0], rtol=1e-6)
    np.testing.assert_allclose(m, [0.05, 0.0])
    w = np.array([3.0])
    k.sgd_row(w, w, np.array([2.0]), 0.25, 0.0, False)
    assert w.tolist() == [2.5]


def test_ftrl_l1_zeroes_small_linear_terms():
    w, acc, lin = np.array([0.0, 0.0]), np.full(2, 0.1), np.zeros(2)
    k.ftrl_row(w, acc, lin, np.array([0.01, 5.0]), 0.1, -0.5, 1.0, 0.0, 0.0, 0.0)
    assert w[0] == 0.0 and w[1] != 0.0 and lin.tolist() == [0.01, 5.0]
