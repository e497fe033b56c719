"""What the simulator library shares across families: gradients reaching the
protocol values trains are built from, refusals, every played protocol's
Jacobian against differences, and the protocol maps example."""
import numpy as np
import pytest

from blochsim import Delay, Pulse, Readout, Simulator
from blochsim.simulators import (ASLSimulator, DESSSimulator, FLASHSimulator, fmSSFPSimulator, HSFPSimulator,
                                 HyperechoSimulator, IRbSSFPSimulator, MOLLISimulator, MultiEchoGRESimulator,
                                 MultiEchoSESimulator, WaterFatSimulator)
from protocol_oracles import (TES, _irbssfp_isochromat, _dess_isochromats, _fmssfp_isochromat,
                              _balanced_isochromat, _molli_isochromat, HSFP_FLIPS)


@pytest.mark.parametrize("make,name,value", [
    (lambda: MultiEchoSESimulator(n_echoes=6, ESP=10.0, refocusing=150.0), "refocusing", 150.0),
    (lambda: FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=20), "rf_spoiling", 117.0),
    (lambda: fmSSFPSimulator(flip=30.0, TR=5.0, n=20, sweep=10.0), "sweep", 10.0),
    (lambda: HyperechoSimulator(flip=[30.0, 70.0, 110.0], phases=[0.0, 40.0, 10.0], ESP=5.0), "phases",
     np.array([0.0, 40.0, 10.0])),
], ids=["mese refocusing", "flash rf_spoiling", "fmssfp sweep", "hyperecho phases"])
def test_gradients_of_protocol_values_the_trains_derive_from(make, name, value):
    """Protocol values that a train is built from (a refocusing flip for
    every echo, a quadratic phase schedule, the mirrored half of a
    hyperecho) keep their gradient, shaped like the value given."""
    sim = make()
    t = dict(T1=1000.0, T2=80.0, B0=5.0) if name != "refocusing" else dict(T1=1000.0, T2=80.0)
    s, pullback = sim.vjp(name, **t)
    g = pullback(2 * s)[name]
    assert np.shape(g) == np.shape(value)

    def loss(x):
        return np.sum(np.abs(sim.simulate(**t, **{name: x}).astype(complex)) ** 2)

    for i in np.ndindex(np.shape(value)):
        h = np.zeros(np.shape(value))
        h[i] = 1e-2
        np.testing.assert_allclose(g[i], (loss(value + h) - loss(value - h)) / 2e-2, rtol=2e-2, atol=1e-6)


def test_protocol_refusals_of_the_sequence_library():
    with pytest.raises(ValueError, match="with RF spoiling the phase changes every TR"):
        MultiEchoGRESimulator(flip=20.0, TR=30.0, TE=TES, repetitions="auto").simulate(T1=800.0, T2=60.0)
    from blochsim.simulators import MTSimulator
    with pytest.raises(ValueError, match="repetitions must be 1"):
        MTSimulator(flip=10.0, TR=30.0, repetitions=3)
    with pytest.raises(TypeError, match="plays no ideal inversion .* inv_efficiency would be ignored"):
        FLASHSimulator(flip=10.0, TR=8.0, TE=3.0, n=5).simulate(T1=1000.0, T2=80.0, inv_efficiency=0.9)

    class Balanced(Simulator):
        def repetition(self, p):
            return Delay(2.5) @ Readout() @ Delay(2.5) @ Pulse(30.0)

    with pytest.raises(TypeError, match="plays no ideal inversion"):  # the exact steady-state path
        Balanced(repetitions="auto").simulate(T1=800.0, T2=60.0, inv_efficiency=0.9)
    with pytest.raises(ValueError, match="fat_fraction must be <= 1, got 1.7"):
        WaterFatSimulator(TE=[1.0, 2.0]).simulate(fat_fraction=1.7)
    with pytest.raises(ValueError, match="alpha .* must be <= 1, got 1.2"):
        ASLSimulator(times=[1000.0], alpha=1.2)


# (simulator, its float64 oracle of (T1, T2, B1), B0 and the other tissue values)
PLAYED_ORACLES = {
    "IRbSSFP": (IRbSSFPSimulator(flip=45.0, TR=5.0, nshots=60, TI=15.0),
                lambda T1, T2, B1: _irbssfp_isochromat(45.0, 5.0, 2.5, 60, 15.0, T1, T2, 20.0, B1, 0.95, 1.2),
                dict(B0=20.0, inv_efficiency=0.95, M0=1.2)),
    "DESS": (DESSSimulator(flip=35.0, TR=18.0, TE=4.0, repetitions=60),
             lambda T1, T2, B1: _dess_isochromats(35.0, 18.0, 4.0, 60, T1, T2, 10.0, B1, 1.1),
             dict(B0=10.0, M0=1.1)),
    "fmSSFP": (fmSSFPSimulator(flip=35.0, TR=5.0, n=80, sweep=40.0),
               lambda T1, T2, B1: _fmssfp_isochromat(35.0, 5.0, 2.5, 80, 180.0, 40.0, T1, T2, 15.0, B1),
               dict(B0=15.0)),
    "HSFP": (HSFPSimulator(flip=HSFP_FLIPS, TR=4.5, TI=12.0, inversion=True),
             lambda T1, T2, B1: _balanced_isochromat(HSFP_FLIPS, 4.5, 2.25, 180.0, T1, T2, 8.0, B1, 0.96, 12.0),
             dict(B0=8.0, inv_efficiency=0.96)),
    "MOLLI": (MOLLISimulator(TI=[110.0, 190.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36),
              lambda T1, T2, B1: _molli_isochromat([110.0, 190.0], 900.0, 35.0, 2.6, 36, ((5, 3), (3, 0)), T1, T2,
                                                   5.0, B1, 0.95),
              dict(B0=5.0, inv_efficiency=0.95)),
}


@pytest.mark.parametrize("name", sorted(PLAYED_ORACLES))
def test_played_protocol_jacobians_against_differences_of_their_oracles(name):
    sim, oracle, rest = PLAYED_ORACLES[name]
    x = dict(T1=1100.0, T2=70.0, B1=0.93)
    _, J = sim.jacobian(("T1", "T2", "B1"), **x, **rest)
    for i, k in enumerate(("T1", "T2", "B1")):
        h = 1e-5 * x[k]
        fd = (oracle(**{**x, k: x[k] + h}) - oracle(**{**x, k: x[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[i], fd, rtol=1e-3, atol=3e-6 * max(1.0, np.max(np.abs(fd))), err_msg=k)


def test_protocol_maps_example_runs(capsys):
    """examples/protocol_maps.py: every map comes out near the phantom's truth."""
    import pathlib
    import re
    import runpy
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "protocol_maps.py"
    runpy.run_path(str(path), run_name="example")["main"](24)
    out = capsys.readouterr().out
    errors = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.*?)median error\s+([\d.]+) %", out, re.M)}
    assert errors["MD, diffusion tensor"] < 2.0 and errors["T2*, multi-echo GRE"] < 6.0
    assert errors["T1, DESPOT1 with the B1 map"] < errors["T1, DESPOT1 without it"]
    assert errors["T1, MP2RAGE UNI lookup"] < 10.0
