"""Property-based tests of the public API (hypothesis): every shipped
simulator given random tissue (values, broadcasting shapes, dtypes, NaN and
inf, negative, huge and empty arrays, non-contiguous and read-only arrays,
a wrong ``out=``) and random Pulseq corruption either returns finite values
of the documented shape or raises ValueError, TypeError or MemoryError
naming the parameter; never a crash, never a non-finite result.

Example counts: the ``ci`` profile (conftest.py) by default;
``BLOCHSIM_FUZZ=long pytest tests/test_fuzz.py`` for the long run.
"""
import importlib.util
import pathlib

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import blochsim  # noqa: E402
from blochsim.pulseq import PulseqError  # noqa: E402

_spec = importlib.util.spec_from_file_location("_reliability", pathlib.Path(__file__).with_name("test_reliability.py"))
_rel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rel)
SHIPPED, IDS = _rel.SHIPPED, _rel.IDS

REFUSALS = (ValueError, TypeError, MemoryError)

# values: ordinary ones, edges, and what must be refused
ORDINARY = st.floats(min_value=1e-3, max_value=5e3, allow_nan=False, allow_infinity=False)
SPECIAL = st.sampled_from([0.0, -0.0, -1.0, -1e3, 1e-30, 1e30, 1e39, 3e38, np.nan, np.inf, -np.inf])
VALUES = st.one_of(ORDINARY, ORDINARY, ORDINARY, SPECIAL)
SHAPES = st.sampled_from([(), (), (1,), (3,), (0,), (2, 1), (1, 3), (2, 3), (4,)])
DTYPES = st.sampled_from(["float64", "float64", "float32", "int64", "complex128", "bool", "object"])
LAYOUTS = st.sampled_from(["scalar", "array", "array", "strided", "readonly", "list"])


@st.composite
def tissue_value(draw):
    """One tissue property: a Python float, a list, or an array of some
    shape, dtype and layout."""
    layout = draw(LAYOUTS)
    v = draw(VALUES)
    if layout == "scalar":
        return v
    shape = draw(SHAPES)
    n = int(np.prod(shape))
    vals = [draw(VALUES) if i == 0 else draw(st.one_of(st.just(v), VALUES)) for i in range(n)]
    if layout == "list":
        return np.array(vals, dtype=np.float64).reshape(shape).tolist()
    dtype = draw(DTYPES)
    with np.errstate(all="ignore"):
        if dtype == "object":
            a = np.array(vals, dtype=object).reshape(shape)
        elif dtype in ("int64", "bool"):
            a = np.nan_to_num(np.array(vals, dtype=np.float64)).clip(-1e9, 1e9).astype(dtype).reshape(shape)
        else:
            a = np.array(vals, dtype=dtype).reshape(shape)
    if layout == "strided" and a.ndim:
        big = np.repeat(a, 2, axis=-1)
        a = big[..., ::2]
        assert not a.flags.c_contiguous or a.size <= 1
    if layout == "readonly":
        a.setflags(write=False)
    return a


def _finite_input(v):
    a = np.asarray(v)
    if a.dtype == object or a.dtype.kind not in "fiu":
        return False
    return bool(np.all(np.isfinite(a.astype(np.float64))))


def _names(msg, names):
    return any(k in msg for k in (*names, "out", "tissue"))


def _fuzzed(cls, tissue):
    """The tissue names a test draws: the catalogue's and the common
    optional ones the simulator models."""
    extra = [k for k in ("M0", "B1", "B0") if k in getattr(cls, "tissue_properties", ()) and k not in tissue]
    return list(tissue) + extra


@pytest.mark.parametrize("cls, proto, tissue", SHIPPED, ids=IDS)
def test_simulate_with_random_tissue(cls, proto, tissue):
    sim = cls(**proto)
    samples = sim.simulate(**tissue).shape[-1]
    names = _fuzzed(cls, tissue)

    @given(st.fixed_dictionaries({k: tissue_value() for k in names}), st.sampled_from([None, None, "shape", "dtype"]))
    def check(values, out_kind):
        try:
            shape = np.broadcast_shapes(*(np.shape(v) for v in values.values()))
        except ValueError:
            shape = None
        kw = {}
        if out_kind is not None and shape is not None:
            want = shape + (samples,)
            kw["out"] = (np.empty(want + (1,), np.complex64) if out_kind == "shape"
                         else np.empty(want, np.float32))
        try:
            s = sim.simulate(**values, **kw)
        except REFUSALS as e:
            assert _names(str(e), names), f"{type(e).__name__} names no parameter: {e}"
            return
        # accepted: every input was finite, the shapes broadcast, no bad out=
        assert all(_finite_input(v) for v in values.values()), f"accepted non-finite or non-real input {values}"
        assert shape is not None and not kw
        assert np.shape(s) == shape + (samples,)
        assert np.all(np.isfinite(s)), f"non-finite result for {values}"

    check()


@pytest.mark.parametrize("cls, proto, tissue", SHIPPED, ids=IDS)
def test_jacobian_and_vjp_with_random_tissue(cls, proto, tissue):
    """The derivatives of random tissue: shaped results of finite values,
    or a refusal naming the parameter."""
    sim = cls(**proto)
    samples = sim.simulate(**tissue).shape[-1]
    names = _fuzzed(cls, tissue)
    first = names[0]

    @given(st.fixed_dictionaries({k: tissue_value() for k in names}))
    def check(values):
        try:
            shape = np.broadcast_shapes(*(np.shape(v) for v in values.values()))
        except ValueError:
            shape = None
        try:
            s, J = sim.jacobian((first,), **values)
            s2, pullback = sim.vjp((first,), **values)
            g = pullback(np.ones(np.shape(s2), np.complex64))
        except REFUSALS as e:
            assert _names(str(e), names), f"{type(e).__name__} names no parameter: {e}"
            return
        assert all(_finite_input(v) for v in values.values()) and shape is not None
        assert np.shape(s) == shape + (samples,) and np.shape(J) == shape + (1, samples)
        assert np.all(np.isfinite(s)) and np.all(np.isfinite(s2))
        assert np.shape(g[first]) == np.shape(values[first])
        # derivatives of ordinary tissue are finite (extreme values may overflow float32 by the chain rule)
        if all(np.all((np.abs(np.asarray(v, np.float64)) > 1e-2) & (np.abs(np.asarray(v, np.float64)) < 1e4))
               or np.size(v) == 0 for v in values.values()):
            assert np.all(np.isfinite(J)) and np.all(np.isfinite(g[first]))

    check()


PROTOCOL_VALUES = st.one_of(ORDINARY, SPECIAL, st.lists(ORDINARY, min_size=0, max_size=4),
                            st.lists(VALUES, min_size=1, max_size=3), st.just("fast"), st.none())


@pytest.mark.parametrize("cls, proto, tissue", SHIPPED, ids=IDS)
def test_random_protocols(cls, proto, tissue):
    """One protocol parameter replaced by a random value: a simulator that
    constructs simulates finite values of its sample count, or the
    constructor or call refuses naming the parameter."""
    keys = sorted(proto)

    @given(st.sampled_from(keys), PROTOCOL_VALUES)
    def check(key, value):
        try:
            sim = cls(**{**proto, key: value})
            s = sim.simulate(**tissue)
        except REFUSALS as e:
            assert _names(str(e), keys + list(tissue)) or "protocol" in str(e), \
                f"{type(e).__name__} for {key}={value!r} names no parameter: {e}"
            return
        assert np.all(np.isfinite(s)), f"{key}={value!r} gives non-finite samples"

    check()


# --------------------------------------------------------------------------
# Pulseq files with random corruption

_pspec = importlib.util.spec_from_file_location("_pulseq_tests", pathlib.Path(__file__).with_name("test_pulseq.py"))
_pq = importlib.util.module_from_spec(_pspec)
_pspec.loader.exec_module(_pq)


@pytest.fixture(scope="module")
def seq_text(tmp_path_factory):
    return _pq._spin_echo(tmp_path_factory.mktemp("fuzz") / "se.seq").read_text()


CORRUPTIONS = st.sampled_from(["delete_line", "duplicate_line", "truncate", "replace_number", "swap_lines",
                               "insert_text", "drop_char"])


def test_corrupted_pulseq_files(seq_text, tmp_path_factory):
    root = tmp_path_factory.mktemp("corrupt")
    lines = seq_text.split("\n")
    counter = iter(range(10**9))

    @given(st.lists(st.tuples(CORRUPTIONS, st.integers(0, len(lines) - 1), st.integers(0, 10**6),
                              st.sampled_from(["0", "-1", "1e9", "nan", "inf", "x", "", "[BLOCKS]", "2.5", "99"])),
                    min_size=1, max_size=3))
    def check(edits):
        text = list(lines)
        for kind, i, r, word in edits:
            i = min(i, len(text) - 1)
            if kind == "delete_line" and len(text) > 1:
                del text[i]
            elif kind == "duplicate_line":
                text.insert(i, text[i])
            elif kind == "truncate":
                text = text[:max(1, i)]
            elif kind == "replace_number":
                tok = text[i].split()
                if tok:
                    tok[r % len(tok)] = word
                    text[i] = " ".join(tok)
            elif kind == "swap_lines":
                j = r % len(text)
                text[i], text[j] = text[j], text[i]
            elif kind == "insert_text":
                text.insert(i, word)
            elif kind == "drop_char" and text[i]:
                k = r % len(text[i])
                text[i] = text[i][:k] + text[i][k + 1:]
        path = root / f"c{next(counter)}.seq"
        path.write_text("\n".join(text))
        try:
            sim = blochsim.Simulator.from_pulseq(path)
            s = sim.simulate(T1=1000.0, T2=np.array([40.0, 80.0]))
        except (PulseqError, ValueError, TypeError, MemoryError) as e:
            assert str(path) in str(e) or "Pulseq" in str(e) or "must" in str(e), f"{type(e).__name__}: {e}"
            return
        assert np.all(np.isfinite(s))

    check()
