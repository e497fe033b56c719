"""PERK with default options on shipped simulators: noise-free signals
within 2 % of the truth over the training range, noisy signals no worse
than brute-force dictionary matching, the input handling chosen from the
training signals, and the previous behaviours still selectable."""
import numpy as np
import pytest

from blochsim.estimators import PERK, DictionaryMatcher
from blochsim.simulators import DESPOT1Simulator, FSESimulator, MRFSimulator

FSE = FSESimulator(ESP=10.0, flip=np.full(16, 160.0))
MRF = MRFSimulator(flip=np.concatenate([np.linspace(5, 60, 100), np.linspace(60, 5, 100)]), TR=10.0, TI=20.0,
                   states=16)
DESPOT1 = DESPOT1Simulator(flip=np.array([3.0, 8.0, 15.0, 25.0]), TR=10.0)

CASES = {
    "multi-echo SE": (FSE, dict(T1=1000.0, T2=(20.0, 200.0), M0=(0.5, 1.5)),
                      dict(T1=1000.0, T2=np.geomspace(20.0, 200.0, 400)), 0.01),
    "MRF": (MRF, dict(T1=(300.0, 2500.0), T2=(30.0, 250.0), M0=(0.5, 1.5)),
            dict(T1=np.geomspace(300.0, 2500.0, 100), T2=np.geomspace(30.0, 250.0, 100)), 0.005),
    "DESPOT1": (DESPOT1, dict(T1=(300.0, 2500.0), M0=(0.5, 1.5)), dict(T1=np.geomspace(300.0, 2500.0, 1000)),
                0.0005),
}


def _interior(ranges, n, seed):
    """Draws inside the middle 80 % of each range (fixed values as given)."""
    rng = np.random.default_rng(seed)
    return {k: (rng.uniform(v[0] + 0.1 * (v[1] - v[0]), v[1] - 0.1 * (v[1] - v[0]), n) if isinstance(v, tuple)
                else v) for k, v in ranges.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_noise_free_estimates_within_two_percent(case):
    sim, ranges, _, _ = CASES[case]
    perk = PERK(sim).fit(**ranges)
    truth = _interior(ranges, 200, 1)
    maps = perk.map(sim.simulate(**truth))
    for k in perk.names:
        err = np.abs(maps[k] - truth[k]) / truth[k]
        assert err.max() < 0.02, (k, err.max())


@pytest.mark.parametrize("case", sorted(CASES))
def test_noisy_estimates_no_worse_than_the_dictionary(case):
    """PERK trained at the data's noise level against the best atom of a
    fine grid (M0 from its complex scale), relative rms errors."""
    sim, ranges, grids, sd = CASES[case]
    truth = _interior(ranges, 2000, 5)
    rng = np.random.default_rng(6)
    s = sim.simulate(**truth)
    s = s + sd * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))
    perk = PERK(sim).fit(noise_std=sd, **ranges)
    ours = perk.map(s)
    best = DictionaryMatcher(sim).fit(**grids).map(s)
    best["M0"] = np.abs(best["M0"])
    for k in perk.names:
        rms = np.sqrt(np.mean(((ours[k] - truth[k]) / truth[k]) ** 2))
        ref = np.sqrt(np.mean(((best[k] - truth[k]) / truth[k]) ** 2))
        assert rms <= 1.05 * ref, (k, rms, ref)


def test_auto_inputs_follow_the_training_signals():
    """Signals with no phase information give magnitudes: a spin-echo
    train, a FISP MRF train (phase-free with its sign changes, and over a
    range of B0 too, to which FISP is insensitive); bSSFP MRF over a range
    of B0 carries phase and keeps Cartesian parts."""
    assert PERK(FSE).fit(T1=1000.0, T2=(20.0, 200.0), samples=500).input_mode == "magnitude"
    assert PERK(MRF).fit(T1=(300.0, 2500.0), T2=(30.0, 250.0), samples=500).input_mode == "magnitude"
    assert PERK(MRF).fit(T1=(300.0, 2500.0), T2=(30.0, 250.0), B0=(-20.0, 20.0),
                         samples=500).input_mode == "magnitude"
    bssfp = MRFSimulator(flip=np.linspace(10.0, 60.0, 100), TR=8.0, kind="bssfp", states=4)
    assert PERK(bssfp).fit(T1=(300.0, 2500.0), T2=(30.0, 250.0), B0=(-20.0, 20.0),
                           samples=500).input_mode == "cartesian"
    assert PERK(FSE, complex_mode="cartesian").fit(T1=1000.0, T2=(20.0, 200.0), samples=500).input_mode == "cartesian"


def test_auto_subspace_is_limited_by_the_noise():
    clean = PERK(MRF).fit(T1=(300.0, 2500.0), T2=(30.0, 250.0), samples=500)
    noisy = PERK(MRF).fit(noise_std=0.005, T1=(300.0, 2500.0), T2=(30.0, 250.0), samples=500)
    assert noisy._basis.shape[1] < clean._basis.shape[1] < 200
    assert PERK(MRF, subspace=None).fit(T1=(300.0, 2500.0), T2=(30.0, 250.0), samples=500)._basis is None
    assert PERK(MRF, subspace=6).fit(T1=(300.0, 2500.0), T2=(30.0, 250.0), samples=500)._basis.shape == (200, 6)


def test_the_published_length_scale_is_selectable():
    """length_scale="std" (each coordinate's training spread times sqrt(d))
    with Cartesian inputs and no subspace is the earlier default: the same
    maps as that length scale given explicitly."""
    ranges = dict(T1=1000.0, T2=(20.0, 200.0), M0=(0.5, 1.5))
    old = PERK(FSE, n_features=300, complex_mode="cartesian", subspace=None, length_scale="std")
    old.fit(noise_std=0.01, samples=3000, **ranges)
    spec = dict(spans={"T2": (20.0, 200.0), "M0": (0.5, 1.5)}, fixed={"T1": 1000.0}, known=(), samples=3000, seed=0,
                noise_std=0.01)
    first = old._draws(spec, 0, 1)[0]  # the length scale is the first training block's spread
    x0 = old._inputs(first[2], [])[0].astype(np.float64)
    sd = np.std(x0, axis=0)
    ell = np.where(sd > 0, sd, 1.0) * np.sqrt(x0.shape[1])
    given = PERK(FSE, n_features=300, complex_mode="cartesian", subspace=None, length_scale=ell)
    given.fit(noise_std=0.01, samples=3000, **ranges)
    s = FSE.simulate(T1=1000.0, T2=np.array([40.0, 80.0]), M0=1.0)
    a, b = old.map(s), given.map(s)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("kw, match", [
    (dict(length_scale="wide"), "length_scale must be positive numbers, 'std' or None, got 'wide'"),
    (dict(subspace="some"), "subspace must be a positive integer, 'auto' or None, got 'some'"),
    (dict(subspace=0), "subspace"),
])
def test_option_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        PERK(FSE, **kw)
