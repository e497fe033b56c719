"""Z-spectra against the CEST community's reference tools and a float64
Bloch-McConnell integration written here.

Protocols are written in the pulseq-cest form with pypulseq and BMCTool's
own writer (offsets_ppm, M0_offset, saturation trains, spoilers, an ADC per
offset), simulated by BMCTool (bmctool, the pulseq-cest project's
simulator) and by blochsim's PulseqCESTSimulator; CESTSimulator is checked
against the same integration.  BMCTool's pools map to blochsim's as:
fractions relative to water f -> f / (1 + sum f); its rate k (pool to
water) -> k / f_water (blochsim's one constant per pair, k_ab = k f_b);
chemical shifts ppm -> Hz at BMCTool's 42.5764 MHz/T.  BMCTool reports the
water pool's Mz; blochsim's readout sums the liquid pools (SPEC), so the
BMCTool side adds the CEST pools' Mz from its full state vector.
"""
import functools
import importlib.util
import pathlib

import numpy as np
import pytest
from scipy.linalg import expm

pp = pytest.importorskip("pypulseq")

# the writers leave RF and ADC delays to pypulseq, which raises them to the dead times and says so
pytestmark = pytest.mark.filterwarnings("ignore:Specified (RF|ADC) delay:UserWarning")
bmctool = pytest.importorskip("bmctool")

from bmctool.parameters import CESTPool, MTPool, Options, Parameters, System, WaterPool  # noqa: E402
from bmctool.simulation import BMCSim  # noqa: E402
from bmctool.utils.seq.write import write_seq  # noqa: E402

from blochsim.pulseq import PulseqCESTSimulator, PulseqError  # noqa: E402
from blochsim.simulators import CESTSimulator  # noqa: E402

# the super-Lorentzian's defining integral by quad, from test_pools.py (tests import in importlib mode)
_spec = importlib.util.spec_from_file_location("_pool_oracles", pathlib.Path(__file__).with_name("test_pools.py"))
_pool_oracles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_pool_oracles)
sl_integral = _pool_oracles.sl_integral

GAMMA_HZ_PER_UT = 42.5764  # BMCTool's and pulseq-cest's
B0_T = 3.0
HZ_PER_PPM = GAMMA_HZ_PER_UT * B0_T
WATER = dict(T1=1.3, T2=0.075)
CEST = [dict(f=9e-4, t1=1.3, t2=0.1, k=50.0, dw=3.5), dict(f=2.7e-3, t1=1.3, t2=0.02, k=600.0, dw=2.0)]
MT = dict(f=0.08, t1=1.0, t2=12e-6, k=30.0, dw=0.0)


def cest_file(path, offsets_ppm, B1=1.0, tp=0.1, n_pulses=3, td=0.01, shape="block", m0_offset=-300.0):
    """A pulseq-cest protocol: per offset a recovery delay, n_pulses
    saturation pulses (block or Gaussian, B1 as their rms amplitude in µT)
    separated by td, a spoiler, and one ADC."""
    # no RF dead or ringdown time: BMCTool does not play them (blochsim does)
    sys = pp.Opts(max_grad=40, grad_unit="mT/m", max_slew=130, slew_unit="T/m/s", rf_ringdown_time=0.0,
                  rf_dead_time=0.0, rf_raster_time=1e-6)
    seq = pp.Sequence(system=sys)
    spoil = pp.make_trapezoid("z", area=5000, duration=5e-3, system=sys)
    adc = pp.make_adc(num_samples=1, duration=1e-3)
    for i, ppm in enumerate(offsets_ppm):
        seq.add_block(pp.make_delay(3.0))
        for k in range(n_pulses):
            if shape == "block":
                rf = pp.make_block_pulse(2 * np.pi * GAMMA_HZ_PER_UT * B1 * tp, duration=tp,
                                         freq_offset=ppm * HZ_PER_PPM, system=sys)
            else:
                rf = pp.make_gauss_pulse(np.pi / 2, duration=tp, time_bw_product=2, freq_offset=ppm * HZ_PER_PPM,
                                         system=sys)
                rms = np.sqrt(np.mean(np.abs(rf.signal) ** 2))
                rf.signal = rf.signal * GAMMA_HZ_PER_UT * B1 / rms
            seq.add_block(rf)
            if k + 1 < n_pulses:
                seq.add_block(pp.make_delay(td))
        seq.add_block(spoil)
        seq.add_block(adc)
    defs = dict(offsets_ppm=np.asarray(offsets_ppm), num_meas=len(offsets_ppm), b0=B0_T, b1pa=B1, tp=tp,
                n_pulses=n_pulses, trec=3.0, m0_offset=m0_offset, seq_id_string="blochsim_test")
    write_seq(seq, defs, str(path), author="blochsim tests")
    return path


def bmc(path, mt=None, lineshape="Lorentzian"):
    """BMCTool's samples: water plus CEST pools' Mz at each ADC."""
    pools = [CESTPool(f=c["f"], t1=c["t1"], t2=c["t2"], k=c["k"], dw=c["dw"]) for c in CEST]
    mtp = None if mt is None else MTPool(f=mt["f"], t1=mt["t1"], t2=mt["t2"], k=mt["k"], dw=mt["dw"],
                                        lineshape=lineshape)
    p = Parameters(WaterPool(f=1.0, t1=WATER["T1"], t2=WATER["T2"]), pools, mtp,
                   System(b0=B0_T, gamma=2 * np.pi * GAMMA_HZ_PER_UT, b0_inhom=0.0, rel_b1=1.0),
                   Options(verbose=False, reset_init_mag=True, scale=1.0, max_pulse_samples=100000))
    sim = BMCSim(p, str(path), verbose=False)
    sim.run()
    n = len(pools)
    z = sim.m_out[2 * (n + 1): 3 * (n + 1)]  # Mz of water and the CEST pools
    return np.sum(z, axis=0)


def blochsim_tissue(mt=None):
    """BMCTool's pools as blochsim's tissue properties (module notes)."""
    total = 1.0 + sum(c["f"] for c in CEST) + (0.0 if mt is None else mt["f"])
    fw = 1.0 / total
    t = dict(T1=WATER["T1"] * 1e3, T2=WATER["T2"] * 1e3)
    for letter, c in zip("BC", CEST):
        t.update({f"pool{letter}_fraction": c["f"] / total, f"pool{letter}_exchange": c["k"] / fw,
                  f"pool{letter}_T1": c["t1"] * 1e3, f"pool{letter}_T2": c["t2"] * 1e3,
                  f"pool{letter}_shift": c["dw"] * HZ_PER_PPM})
    if mt is not None:
        t.update(bound_fraction=mt["f"] / total, bound_exchange=mt["k"] / fw, bound_T1=mt["t1"] * 1e3,
                 bound_T2=mt["t2"] * 1e3)
    return t


# --------------------------------------------------------------------------
# the float64 Bloch-McConnell oracle


def G(kind, df, T2):
    """Lineshape density over angular frequency (s)."""
    x = 2 * np.pi * df * T2
    if kind == "lorentzian":
        return T2 / np.pi / (1 + x * x)
    return T2 * sl_integral(max(abs(x), 1e-3))


def bm_generator(tissue, w1, df_rf, lineshape, B0=0.0, psi=0.0):
    """Generator and inhomogeneity of the Bloch-McConnell equations in the
    frame turning with an RF of frequency df_rf (Hz), the RF at SPEC phase
    psi and amplitude w1 (rad/s), SPEC's handedness (phase 0 tips z onto
    -y, spins at B0 > 0 turn clockwise): state [x_w, y_w, z_w, (x, y, z)
    per CEST pool, z_bound]."""
    pools = [(1.0 - sum(tissue.get(f"pool{x}_fraction", 0.0) for x in "BC") - tissue.get("bound_fraction", 0.0),
              tissue["T1"] * 1e-3, tissue["T2"] * 1e-3, 0.0, 0.0)]
    for x in "BC":
        if f"pool{x}_fraction" in tissue:
            pools.append((tissue[f"pool{x}_fraction"], tissue[f"pool{x}_T1"] * 1e-3, tissue[f"pool{x}_T2"] * 1e-3,
                          tissue[f"pool{x}_shift"], tissue[f"pool{x}_exchange"]))
    n = len(pools)
    bound = "bound_fraction" in tissue
    N = 3 * n + bound
    A, b = np.zeros((N, N)), np.zeros(N)
    fw = pools[0][0]
    nx, ny = np.cos(psi), np.sin(psi)
    for i, (f, T1, T2, shift, k) in enumerate(pools):
        dw = 2 * np.pi * (B0 + shift - df_rf)
        x, y, z = 3 * i, 3 * i + 1, 3 * i + 2
        A[x, x] = A[y, y] = -1 / T2
        A[z, z] = -1 / T1
        A[x, y], A[y, x] = dw, -dw
        A[x, z], A[y, z], A[z, x], A[z, y] = w1 * ny, -w1 * nx, -w1 * ny, w1 * nx
        b[z] = f / T1
        if i:  # exchange with water, k_ab = k f_b
            for c in range(3):
                A[c, c] -= k * f
                A[3 * i + c, 3 * i + c] -= k * fw
                A[c, 3 * i + c] += k * fw
                A[3 * i + c, c] += k * f
    if bound:
        f, T1, k = tissue["bound_fraction"], tissue["bound_T1"] * 1e-3, tissue["bound_exchange"]
        W = np.pi * w1 ** 2 * G(lineshape, df_rf - B0, tissue["bound_T2"] * 1e-3)
        zb = N - 1
        A[zb, zb] = -1 / T1 - W - k * fw
        A[2, 2] -= k * f
        A[2, zb] += k * fw
        A[zb, 2] += k * f
        b[zb] = f / T1
    return A, b, n


def bm_step(M, A, b, t):
    N = len(M)
    aug = np.zeros((N + 1, N + 1))
    aug[:N, :N], aug[:N, N] = A, b
    E = expm(aug * t)
    return E[:N, :N] @ M + E[:N, N]


def _turn(M, n, angle):
    """Every pool's (x, y) turned by angle (counterclockwise)."""
    M = M.copy()
    c, s_ = np.cos(angle), np.sin(angle)
    for i in range(n):
        x, y = M[3 * i], M[3 * i + 1]
        M[3 * i], M[3 * i + 1] = c * x - s_ * y, s_ * x + c * y
    return M


def bm_offset(tissue, offset_hz, train, lineshape="super-lorentzian", B0=0.0):
    """Liquid Mz after a train [(amplitude Hz, duration s, delay after s)]
    from equilibrium in the frame of one oscillator at offset_hz, the
    transverse states spoiled after every pulse (CESTSimulator's default)."""
    A0, b0, n = bm_generator(tissue, 0.0, offset_hz, lineshape, B0)
    M = np.linalg.solve(A0, -b0)
    for amp, dur, gap in train:
        A, b, _ = bm_generator(tissue, 2 * np.pi * amp, offset_hz, lineshape, B0)
        M = bm_step(M, A, b, dur)
        for j in range(n):
            M[3 * j] = M[3 * j + 1] = 0.0
        M = bm_step(M, A0, b0, gap)
    return sum(M[3 * i + 2] for i in range(n))


def bm_file(path, tissue, lineshape="super-lorentzian", B0=0.0):
    """The liquid Mz at each ADC of a pulseq-cest file, read by pypulseq and
    integrated in float64, every offset from equilibrium (as BMCTool's
    reset): delays relax; an RF event is stepped per raster cell (a block
    pulse as one) in its frequency's frame, its phase referenced to its own
    start (the format's convention); a gradient block spoils; an ADC
    records at its start."""
    seq = pp.Sequence()
    seq.read(str(path))
    A0, b0, n = bm_generator(tissue, 0.0, 0.0, lineshape, B0)
    eq = np.linalg.solve(A0, -b0)
    M, out = eq.copy(), []
    for i in seq.block_events:
        blk = seq.get_block(i)
        dur = seq.block_durations[i]
        if blk.adc is not None:
            out.append(sum(M[3 * j + 2] for j in range(n)))
            M = eq.copy()
            continue
        if blk.rf is not None:
            rf = blk.rf
            t, sig = np.asarray(rf.t, float), np.asarray(rf.signal, complex)
            if t.size == 2:  # a block pulse
                cells, dt = sig[:1], t[1] - t[0]
            else:
                cells, dt = sig, 1e-6
            M = bm_step(M, A0, b0, rf.delay)
            f = rf.freq_offset
            phase0 = rf.phase_offset
            for j, w in enumerate(cells):
                psi = -(phase0 + 2 * np.pi * f * j * dt + np.angle(w))  # SPEC's phase at the cell's start
                A, b, _ = bm_generator(tissue, 2 * np.pi * abs(w), f, lineshape, B0, psi)
                M = _turn(bm_step(M, A, b, dt), n, -2 * np.pi * f * dt)
            M = bm_step(M, A0, b0, dur - rf.delay - cells.size * dt)
            continue
        M = bm_step(M, A0, b0, dur)
        if any(getattr(blk, g, None) is not None for g in ("gx", "gy", "gz")):
            for j in range(n):
                M[3 * j] = M[3 * j + 1] = 0.0
    return np.array(out)


# --------------------------------------------------------------------------

OFFSETS = [-300.0, -5.0, -3.5, -2.0, -1.0, -0.4, 0.0, 0.6, 1.0, 2.0, 3.5, 5.0]


@pytest.mark.parametrize("mt", [None, "lorentzian"])
def test_pulseq_cest_against_bmctool(tmp_path, mt):
    """Water with two CEST pools, without and with a Lorentzian semisolid
    pool: every Z value against BMCTool to 1e-4."""
    path = cest_file(tmp_path / "apt.seq", OFFSETS)
    mtd = None if mt is None else MT
    ref = bmc(path, mtd, "Lorentzian")
    want = ref[1:] / ref[0]
    sim = PulseqCESTSimulator(path, lineshape="lorentzian")
    np.testing.assert_array_equal(sim.z_offsets_ppm, OFFSETS[1:])
    z = sim.simulate(**blochsim_tissue(mtd))
    np.testing.assert_allclose(z.real, want, atol=1e-4)
    assert np.max(np.abs(z.imag)) < 1e-6
    # the raw samples: the liquid Mz, the M0 reference included
    raw = PulseqCESTSimulator(path, normalize=False, lineshape="lorentzian").simulate(M0=2.0, **blochsim_tissue(mtd))
    total = 1.0 + sum(c["f"] for c in CEST) + (0.0 if mtd is None else MT["f"])
    np.testing.assert_allclose(raw.real, 2.0 * ref / total, atol=2e-4)


def test_pulseq_cest_super_lorentzian_against_bloch_mcconnell(tmp_path, monkeypatch):
    """The default super-Lorentzian, evaluated from its integral near water,
    against the float64 Bloch-McConnell integration with quad's lineshape,
    to 1e-4; against BMCTool with its lineshape evaluated from the same
    integral (by quad), to 1e-4; and against BMCTool as shipped, whose
    super-Lorentzian is a 101-point rectangle rule continued by a spline
    within 1 ppm of the pool, to the size of that difference."""
    path = cest_file(tmp_path / "mt.seq", OFFSETS, n_pulses=2, td=0.005)
    t = blochsim_tissue(MT)
    z = PulseqCESTSimulator(path).simulate(**t).real
    m = bm_file(path, t)
    np.testing.assert_allclose(z, m[1:] / m[0], atol=1e-4)
    shipped = bmc(path, MT, "SuperLorentzian")
    np.testing.assert_allclose(z, shipped[1:] / shipped[0], atol=5e-3)

    from bmctool.simulation.BlochMcConnellSolver import BlochMcConnellSolver

    @functools.lru_cache(maxsize=None)
    def g(x):
        return sl_integral(max(x, 1e-3))

    def integral_lineshape(self, offset, w0):
        # BMCTool's lineshape is pi G(offset) over angular frequency (W = w1^2 times it)
        t2 = 1.0 / self.params.mt_pool.r2
        return np.pi * t2 * g(abs(offset - self.params.mt_pool.dw * w0) * t2)

    monkeypatch.setattr(BlochMcConnellSolver, "get_mt_shape_at_offset", integral_lineshape)
    ref = bmc(path, MT, "SuperLorentzian")
    np.testing.assert_allclose(z, ref[1:] / ref[0], atol=1e-4)
    # the classic 1.5 kHz continuation saturates the semisolid pool less near water
    classic = PulseqCESTSimulator(path, lineshape="super-lorentzian-cutoff").simulate(**t).real
    near = np.abs(np.array(OFFSETS[1:])) <= 2.0
    assert np.all(classic[near] >= z[near] - 1e-7) and np.max(classic[near] - z[near]) > 5e-3


def test_shaped_saturation_against_bloch_mcconnell(tmp_path):
    """Gaussian saturation pulses (played sample by sample on the 1 µs
    raster: 4000 rotations with exchange and relaxation between them, in
    the kernels' float32) with two CEST pools and the semisolid pool,
    against the integration stepped per raster cell with expm: within
    2e-4 (rectangular pulses, one exact step each, hold 1e-4 above)."""
    offsets = [-300.0, -3.5, 1.0]
    path = cest_file(tmp_path / "gauss.seq", offsets, tp=0.002, n_pulses=2, td=0.002, shape="gauss", B1=2.0)
    t = blochsim_tissue(MT)
    z = PulseqCESTSimulator(path).simulate(**t).real
    m = bm_file(path, t)
    np.testing.assert_allclose(z, m[1:] / m[0], atol=2e-4)


def test_cest_simulator_z_against_bloch_mcconnell():
    """CESTSimulator's Z is the saturated over the unsaturated acquisition:
    1 far from every resonance, M0 cancelling; normalize=False keeps the
    liquid Mz."""
    t = blochsim_tissue(MT)
    offs = np.array([-100.0, -3.5, 0.5, 3.5])
    sim = CESTSimulator(offsets=offs, B1sat=1.0, n_pulses=2, pulse_duration=100.0, pulse_delay=5.0,
                        field_strength=B0_T)
    z = sim.simulate(M0=3.0, **t).real
    hz = offs * sim.hz_per_ppm(sim._protocol_values({}))
    amp = sim.hz_per_ppm(sim._protocol_values({})) / B0_T * 1.0  # gamma B1 / 2 pi at 1 µT
    train = [(amp, 0.1, 0.005), (amp, 0.1, 0.0)]
    liquid = 1 - t["bound_fraction"]
    want = np.array([bm_offset(t, h, train) for h in hz]) / liquid
    np.testing.assert_allclose(z, want, atol=1e-4)
    assert 0.99 < z[0] < 1  # the semisolid pool, saturated a little even 100 ppm away
    raw = CESTSimulator(offsets=offs, B1sat=1.0, n_pulses=2, pulse_duration=100.0, pulse_delay=5.0,
                        field_strength=B0_T, normalize=False).simulate(M0=3.0, **t).real
    np.testing.assert_allclose(raw, 3.0 * liquid * want, atol=3e-4)


def test_cest_simulator_normalised_derivatives():
    """Jacobian and pullback of Z = S / S_ref against central differences."""
    t = blochsim_tissue(MT)
    t = {k: np.array([v]) for k, v in t.items()}
    sim = CESTSimulator(offsets=np.array([-3.5, 1.0, 3.5]), B1sat=1.5, n_pulses=2, pulse_duration=50.0,
                        pulse_delay=5.0, repetitions=2)
    names = ("T1", "bound_fraction", "poolB_exchange")
    z, J = sim.jacobian(names, **t)
    for i, k in enumerate(names):
        h = 1e-3 * float(t[k][0])
        up = sim.simulate(**{**t, k: t[k] + h})
        dn = sim.simulate(**{**t, k: t[k] - h})
        np.testing.assert_allclose(J[:, i], (up - dn) / (2 * h), rtol=2e-3, atol=2e-6, err_msg=k)
    z2, pullback = sim.vjp(("pulse_duration", "B1sat", "T1"), **t)
    g = pullback(2 * z2)
    loss = lambda **kw: float(np.sum(np.abs(sim.simulate(**{**t, **kw})) ** 2))  # noqa: E731
    # small steps: Z oscillates fast with the pulses' flip
    for k, h, kw in (("pulse_duration", 0.005, "pulse_duration"), ("B1sat", 1e-3, "B1sat")):
        base = {"pulse_duration": 50.0, "B1sat": 1.5}[k]
        fd = (loss(**{kw: base + h}) - loss(**{kw: base - h})) / (2 * h)
        np.testing.assert_allclose(g[k], fd, rtol=2e-3, err_msg=k)
    fd = (loss(T1=t["T1"] + 1.0) - loss(T1=t["T1"] - 1.0)) / 2.0
    np.testing.assert_allclose(g["T1"], fd, rtol=2e-3)


def test_pulseq_cest_refusals(tmp_path):
    path = cest_file(tmp_path / "ok.seq", [-300.0, 1.0])
    text = path.read_text()
    no_offsets = tmp_path / "no.seq"
    no_offsets.write_text("\n".join(line for line in text.splitlines() if not line.startswith("offsets_ppm")))
    with pytest.raises(PulseqError, match="no offsets_ppm definition"):
        PulseqCESTSimulator(no_offsets)
    wrong = tmp_path / "wrong.seq"
    wrong.write_text(text.replace("offsets_ppm -300 1", "offsets_ppm -300 1 2"))
    with pytest.raises(PulseqError, match="2 ADC events but 3 offsets_ppm"):
        PulseqCESTSimulator(wrong)
    no_m0 = cest_file(tmp_path / "nom0.seq", [-3.0, 1.0], m0_offset=-500.0)
    with pytest.raises(PulseqError, match="no M0 reference offset"):
        PulseqCESTSimulator(no_m0)
    assert PulseqCESTSimulator(no_m0, normalize=False).simulate(T1=1300.0, T2=75.0).shape == (2,)
    with pytest.raises(TypeError, match="normalize must be True or False"):
        PulseqCESTSimulator(path, normalize="yes")


def test_saturation_resonates_at_plus_its_offset_in_every_path(tmp_path):
    """An RF offset of +f Hz saturates water at B0 = +f: a pulseq-cest file,
    CESTSimulator and a RectPulse train, swept over B0."""
    f = 1.0 * HZ_PER_PPM
    B0 = np.linspace(-2 * f, 2 * f, 41)
    # a long weak pulse on short-T2 water: near its steady state, deepest on resonance and even about it
    water = dict(T1=1000.0, T2=20.0, B0=B0)
    path = cest_file(tmp_path / "one.seq", [-300.0, 1.0], n_pulses=1, tp=2.0, B1=0.5)
    z = PulseqCESTSimulator(path).simulate(**water).real[:, 0]
    assert B0[np.argmin(z)] == pytest.approx(f)
    np.testing.assert_allclose(z[30 - 5:30], z[30 + 5:30:-1], rtol=1e-4)
    z = CESTSimulator(offsets=[1.0], field_strength=B0_T * GAMMA_HZ_PER_UT / 42.57747892, n_pulses=1,
                      B1sat=0.5, pulse_duration=2000.0).simulate(**water).real[:, 0]
    assert B0[np.argmin(z)] == pytest.approx(f)


def test_published_wasabi_protocol_runs_unchanged():
    """BMCTool's shipped WASABI.seq (pulseq-cest format 1.4: 32 offsets, a
    3.7 µT 5 ms block pulse, spoilers on every axis, M0 at -300 ppm) read as
    it is, on its water pool (T1 1 s, T2 1/15 s) with B0 and B1 errors,
    against BMCTool to 1e-4."""
    import bmctool as _b

    path = pathlib.Path(_b.__file__).parent / "library" / "seq-library" / "WASABI.seq"
    sim = PulseqCESTSimulator(path)
    assert sim.z_offsets_ppm.size == 31
    for b0_ppm, rel_b1 in ((0.0, 1.0), (0.1, 0.9)):
        p = Parameters(WaterPool(f=1.0, t1=1.0, t2=1 / 15), [], None,
                       System(b0=3.0, gamma=2 * np.pi * GAMMA_HZ_PER_UT, b0_inhom=b0_ppm, rel_b1=rel_b1),
                       Options(verbose=False, reset_init_mag=True, scale=1.0, max_pulse_samples=100000))
        ref = BMCSim(p, str(path), verbose=False)
        ref.run()
        mz = ref.m_out[2]
        z = sim.simulate(T1=1000.0, T2=1000 / 15, B0=b0_ppm * 3.0 * GAMMA_HZ_PER_UT, B1=rel_b1).real
        np.testing.assert_allclose(z, mz[1:] / mz[0], atol=1e-4, err_msg=f"B0 {b0_ppm} ppm, B1 {rel_b1}")


def test_max_pulse_samples_keeps_the_area(tmp_path):
    """Gaussian saturation coarsened to 50 samples a pulse (each the mean
    of its group) stays within 2e-3 of the full raster, and refusals."""
    path = cest_file(tmp_path / "g.seq", [-300.0, -3.5, 1.0], tp=0.004, n_pulses=2, td=0.002, shape="gauss")
    t = blochsim_tissue(MT)
    full = PulseqCESTSimulator(path).simulate(**t).real
    coarse = PulseqCESTSimulator(path, max_pulse_samples=50).simulate(**t).real
    np.testing.assert_allclose(coarse, full, atol=2e-3)
    assert np.max(np.abs(coarse - full)) > 0
    with pytest.raises(ValueError, match="max_pulse_samples must be >= 1"):
        PulseqCESTSimulator(path, max_pulse_samples=0)


@pytest.mark.parametrize("normalize", [True, False])
def test_pulseq_cest_jacobian_against_differences(tmp_path, normalize):
    path = cest_file(tmp_path / "j.seq", [-300.0, -3.5, 0.5, 3.5], n_pulses=2, tp=0.05, td=0.005)
    sim = PulseqCESTSimulator(path, normalize=normalize)
    t = {k: np.array([v]) for k, v in blochsim_tissue(MT).items()}
    t["B0"] = np.array([15.0])
    names = ("T1", "poolB_exchange", "bound_fraction", "B0")
    z, J = sim.jacobian(names, **t)
    np.testing.assert_allclose(z, sim.simulate(**t), rtol=1e-6)
    assert J.shape == (1, 4, z.shape[-1])
    for i, k in enumerate(names):
        h = 1e-3 * max(abs(float(t[k][0])), 1.0)
        fd = (sim.simulate(**{**t, k: t[k] + h}).astype(complex) - sim.simulate(**{**t, k: t[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[:, i], fd, rtol=2e-3, atol=2e-5 * max(1.0, np.max(np.abs(fd))), err_msg=k)
    z1, J1 = sim.jacobian("T1", **t)
    np.testing.assert_array_equal(J1, J[:, 0])


def test_pulseq_cest_takes_dask_arrays(tmp_path):
    """Dask tissue arrays give a lazy Z-spectrum per voxel chunk, equal to
    the NumPy call's (blochsim.distributed)."""
    da = pytest.importorskip("dask.array")
    sim = PulseqCESTSimulator(cest_file(tmp_path / "apt.seq", OFFSETS), lineshape="lorentzian")
    B0 = np.linspace(-20.0, 20.0, 6)
    ref = sim.simulate(B0=B0, **blochsim_tissue())
    lazy = sim.simulate(B0=da.from_array(B0, chunks=2), **blochsim_tissue())
    assert isinstance(lazy, da.Array) and lazy.shape == ref.shape
    np.testing.assert_array_equal(lazy.compute(scheduler="sync"), ref)
    s, J = sim.jacobian("B0", B0=da.from_array(B0, chunks=3), **blochsim_tissue())
    rs, rJ = sim.jacobian("B0", B0=B0, **blochsim_tissue())
    np.testing.assert_array_equal(J.compute(scheduler="sync"), rJ)
