"""The engine's route (blochsim._engine): every operation, residence and
kind has its entry, a public method reaches it once, and NumPy inputs sent
through the card stream in chunks whose results are the whole call's.  The
card's kernels are stood in for by the host's here (CI has no GPU); the GPU
suite (test_gpu.py) runs the same chunks on the card."""
import ast
import math
import pathlib

import numpy as np
import pytest

from blochsim import _core
from blochsim._engine import device, dispatch, host, reverse, streaming
from blochsim._engine.request import OPERATIONS, Request
from blochsim._engine.table import TABLE, run
from blochsim.simulators import MRFSimulator

FLIPS = np.concatenate([np.linspace(5, 60, 30), np.linspace(60, 2, 30)])


def test_every_operation_residence_and_kind_has_an_entry():
    for op in OPERATIONS:
        for residence in ("host", "through", "device"):
            for kind in ("single", "pooled", "keyed"):
                # second order with pools or moments is refused by name before the table
                refused = op == "jacobian_vjp" and kind != "single"
                assert ((op, residence, kind) in TABLE) != refused, (op, residence, kind)


def test_each_public_method_reaches_the_engine_once():
    source = pathlib.Path(__file__).resolve().parents[1] / "blochsim" / "simulator.py"
    if not source.is_file():
        pytest.skip("needs the source folder")
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Simulator")
    for method in cls.body:
        if isinstance(method, ast.FunctionDef) and method.name in OPERATIONS:
            calls = [n for n in ast.walk(method) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run"]
            backends = [n for n in ast.walk(method) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                        and n.value.id in ("host", "device", "pooled", "streaming", "_core")]
            assert len(calls) == 1 and not backends, method.name


@pytest.fixture
def host_card(monkeypatch):
    """The card's entries that streaming calls, played by the host kernels on
    each chunk; returns the list of chunk sizes played."""
    played = []

    def jacobian(owner, ps, intake, names, fields, scale, one, out=None):
        _, _, part, shape = intake
        played.append(shape[0])
        return host.jacobian(owner, ps, part, shape, fields, scale, one, 1, 0, out)[0]

    def planes(intake):
        _, _, part, shape = intake
        played.append(shape[0])
        return host.si_planes(part, shape), math.prod(shape)

    def adjoint(owner, s, ps, intake, fields, forward=True):
        si, n = planes(intake)

        def raw(cot):
            ev, tg = np.zeros((s.n_events, 4)), np.zeros((n, len(fields)), np.float32)
            _core.adjoint_host(ps, si, n, fields, cot.reshape(n, s.n_samples), ev, tg, 1)
            return ev, tg

        return None, raw

    def second_order(owner, s, ps, intake, names, one, forward=True):
        si, n = planes(intake)
        fields, scale = reverse.fields_and_scale(names)

        def raw(W, sc=None):
            ev = np.zeros((s.n_events, 4))
            for j, f in enumerate(fields):
                part = np.zeros_like(ev)
                _core.adjoint2_host(ps, si, n, f, W, j, part, 1)
                ev += scale[j] * part
            if sc is not None:
                part = np.zeros_like(ev)
                _core.adjoint_host(ps, si, n, [], sc, part, np.zeros((n, 0), np.float32), 1)
                ev += part
            return ev

        return None, None, raw

    forward = host.forward
    monkeypatch.setattr(device, "jacobian", jacobian)
    monkeypatch.setattr(device, "adjoint", adjoint)
    monkeypatch.setattr(device, "second_order", second_order)
    monkeypatch.setattr(host, "forward", lambda *a, streamed=None, **k: forward(*a, **k))
    return played


def _through(sim, op, tissue, **fields):
    """A request of NumPy inputs routed through the card."""
    p = sim._protocol_values({})
    route = dispatch.Route("cuda", [], 1)
    return run(Request(op, sim._streams(p), tissue, route, **fields))


def test_numpy_through_the_card_in_chunks_equals_the_whole(host_card):
    rng = np.random.default_rng(2)
    tissue = {"T1": rng.uniform(300, 2500, (7, 9)), "T2": rng.uniform(20, 200, (1, 9)), "M0": 0.8}
    budget = 5 * 60 * 8 * 3  # a chunk of 5 voxels for the Jacobian of two directions
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16, budget_bytes=budget)
    s_h, J_h = sim.jacobian(("T1", "T2"), **tissue)
    s, J = _through(sim, "jacobian", tissue, names=("T1", "T2"))
    assert host_card and max(host_card) <= 5 and sum(host_card) == 63
    np.testing.assert_array_equal(s, s_h)
    np.testing.assert_array_equal(J, J_h)
    out = (np.empty((7, 9, 60), np.complex64), np.empty((7, 9, 60), np.complex64))
    r = _through(sim, "jacobian", tissue, names=("T2",), one=True, out=out)
    assert r is out and np.array_equal(out[1], J_h[..., 1, :])

    wrt = ("flip", "TR", "T1", "T2")
    p = sim._protocol_values({})
    traced = sim._traced_stream(p, {}, ["flip", "TR"])
    w = np.exp(1j * np.arange(s_h.size) / 5.0).reshape(s_h.shape).astype(np.complex64)
    s_ref, pb_ref = sim.vjp(wrt, **tissue)
    g_ref = pb_ref(w)
    host_card.clear()
    s, pb = _through(sim, "vjp", tissue, names=("T1", "T2"), wrt=wrt, protocol_names=("flip", "TR"), traced=traced)
    g = pb(w)
    assert len(host_card) > 1
    np.testing.assert_array_equal(s, s_ref)
    for k in wrt:
        assert g[k].shape == g_ref[k].shape
        np.testing.assert_allclose(g[k], g_ref[k], rtol=1e-6, atol=1e-6 * np.abs(g_ref[k]).max(), err_msg=k)

    traced = sim._traced_stream(p, {}, ["flip"])
    s2, J2, pb2 = sim.jacobian_vjp(("M0", "T2"), "flip", **tissue)
    W = np.conj(J2) * 0.1
    g2 = pb2(W, 2 * s2)
    host_card.clear()
    s, J, pb = _through(sim, "jacobian_vjp", tissue, names=("M0", "T2"), wrt=("flip",), protocol_names=("flip",),
                        traced=traced)
    np.testing.assert_array_equal(J, J2)
    np.testing.assert_allclose(pb(W, 2 * s2)["flip"], g2["flip"], rtol=1e-6, atol=1e-6 * np.abs(g2["flip"]).max())
    assert len(host_card) > 2


def test_chunks_read_a_broadcast_view_at_their_voxels_only():
    big = (1000, 1000)
    arrays = {"T1": np.broadcast_to(np.float64(1000.0), big), "T2": np.broadcast_to(np.arange(1000.0), big)}
    first = next(streaming.chunks(arrays, big, 7))
    i, j, part = first
    assert (i, j) == (0, 7) and part["T2"].shape == part["T1"].shape == (7,)
    np.testing.assert_array_equal(part["T2"], np.arange(7.0))
    np.testing.assert_array_equal(part["T1"], 1000.0)
    *_, (i, j, part) = streaming.chunks({"T2": np.arange(3.0)[:, None]}, (3, 4), 5)
    assert (i, j) == (10, 12) and list(part["T2"]) == [2.0, 2.0]
    assert streaming.chunk_voxels(10, 100, 350) == 3 and streaming.chunk_voxels(10, 100, 1) == 1
    # a C-ordered array of the voxel shape is sliced, not gathered: its
    # chunks are views of it
    full = np.arange(12.0).reshape(3, 4)
    parts = list(streaming.chunks({"T1": full, "T2": full.T.copy().T}, (3, 4), 5))
    assert [(i, j) for i, j, _ in parts] == [(0, 5), (5, 10), (10, 12)]
    for i, j, part in parts:
        assert np.shares_memory(part["T1"], full) and not np.shares_memory(part["T2"], full)
        np.testing.assert_array_equal(part["T1"], np.arange(i, j, dtype=float))
        np.testing.assert_array_equal(part["T2"], np.arange(i, j, dtype=float))


def test_pools_through_the_card_in_chunks_equal_the_whole(monkeypatch):
    """A pooled call of NumPy inputs on the card runs in chunks under the
    budget (the card's pooled entries stood in for by the host's)."""
    played = []
    pooled, pooled_adjoint = _core.pooled, _core.pooled_adjoint

    def on_host(entry, gpu_at):
        """entry with its ``gpu`` argument (position gpu_at) turned off."""
        def run(*args):
            played.append(args[6])
            return entry(*args[:gpu_at], False, *args[gpu_at + 1:])
        return run

    rng = np.random.default_rng(4)
    tissue = {"T1": rng.uniform(300, 2500, 23), "T2": 80.0, "bound_fraction": rng.uniform(0.05, 0.15, 23),
              "bound_exchange": 20.0}
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=8, budget_bytes=4 * 60 * 8 * 3)
    s_h, J_h = sim.jacobian(("T1", "bound_fraction"), **tissue)
    w = np.exp(1j * np.arange(s_h.size) / 3.0).reshape(s_h.shape).astype(np.complex64)
    g_h = sim.vjp(("flip", "bound_fraction"), **tissue)[1](w)
    monkeypatch.setattr(_core, "pooled", on_host(pooled, 12))
    monkeypatch.setattr(_core, "pooled_adjoint", on_host(pooled_adjoint, 13))
    s, J = _through(sim, "jacobian", tissue, names=("T1", "bound_fraction"))
    assert max(played) <= 4 and sum(played) == 23
    np.testing.assert_array_equal(J, J_h)
    p = sim._protocol_values({})
    traced = sim._traced_stream(p, {}, ["flip"])
    played.clear()
    _, pb = _through(sim, "vjp", tissue, names=("bound_fraction",), wrt=("flip", "bound_fraction"),
                     protocol_names=("flip",), traced=traced)
    g = pb(w)
    assert max(played) < 23 and sum(played) == 2 * 23  # the signal, then the pullback, in chunks
    for k in g_h:
        np.testing.assert_allclose(g[k], g_h[k], rtol=1e-6, atol=1e-6 * np.abs(g_h[k]).max(), err_msg=k)
