"""Pulseq files written out in the test (format 1.4), read by
Simulator.from_pulseq and played, against the spin echo's closed form and
the RF-spoiled gradient echo's isochromat ensemble."""

import warnings

import numpy as np
import pytest

from blochsim import Simulator
from blochsim.pulseq import PulseqBlock, PulseqError, PulseqWarning, decompress_shape

from protocol_oracles import _flash_isochromats  # the FLASH isochromat oracle


def _seq(path, blocks, rf=(), trap=(), adc=(), shapes=(), version=(1, 4, 1), compress=True, grad=()):
    """Write a Pulseq file: rows of each section as tuples, shapes as
    (id, samples), compressed (run-length encoded derivative) or not."""
    out = ["# Pulseq sequence file", "[VERSION]", f"major {version[0]}", f"minor {version[1]}",
           f"revision {version[2]}", "", "[DEFINITIONS]", "BlockDurationRaster 1e-05", "GradientRasterTime 1e-05",
           "RadiofrequencyRasterTime 1e-06", "AdcRasterTime 1e-07", "",
           "# NUM DUR RF  GX  GY  GZ  ADC  EXT", "[BLOCKS]"]
    out += [" ".join(str(x) for x in b) for b in blocks]
    for name, rows in (("RF", rf), ("GRADIENTS", grad), ("TRAP", trap), ("ADC", adc)):
        if rows:
            out += ["", f"[{name}]"] + [" ".join(repr(float(x)) if i and not isinstance(x, str) else str(x)
                                                 for i, x in enumerate(r)) for r in rows]
    if shapes:
        out += ["", "[SHAPES]"]
        for sid, samples in shapes:
            samples = np.asarray(samples, dtype=float)
            vals = list(samples)
            if compress:
                d, vals, i = np.diff(np.concatenate([[0.0], samples])), [], 0
                while i < d.size:
                    j = i
                    while j + 1 < d.size and d[j + 1] == d[i]:
                        j += 1
                    run = j - i + 1
                    vals += [d[i]] if run == 1 else [d[i], d[i], run - 2]
                    i = j + 1
            out += ["", f"shape_id {sid}", f"num_samples {samples.size}"] + [repr(float(v)) for v in vals]
    path.write_text("\n".join(out) + "\n")
    return path


def _rect_hz(flip_deg, dur_us):
    """Amplitude (Hz) of a rectangle of dur_us giving flip_deg."""
    return flip_deg / 360.0 / (dur_us * 1e-6)


def _spin_echo(path, version=(1, 4, 1), freq=0.0, select=False, prefix=(), phase=np.pi / 2, **kw):
    """90° (phase 90°) then crusher, 180°, crusher, ADC: TE = 20 ms between
    the pulse centres and the ADC centre.  ``freq`` (Hz) offsets the 90°,
    played under a gradient on x (rephased in the next block) when
    ``select``; ``prefix`` blocks and RF rows come first."""
    first = len(prefix)
    blocks = [b for b, _ in prefix] + [
        (first + 1, 10, 1, 3 if select else 0, 0, 0, 0, 0), (first + 2, 990, 0, 4 if select else 0, 0, 1, 0, 0),
        (first + 3, 10, 2, 0, 0, 0, 0, 0), (first + 4, 990, 0, 0, 0, 1, 0, 0), (first + 5, 10, 0, 0, 0, 0, 1, 0)]
    if version[1] >= 5:  # amp mag phase time center delay freqPPM phasePPM freq phase use
        rf = [(1, _rect_hz(90.0, 100), 1, 0, 0, 50, 0, 0, 0, freq, phase, "e"),
              (2, _rect_hz(180.0, 100), 1, 0, 0, 50, 0, 0, 0, 0, 0.0, "r")]
        adc = [(1, 100, 1000, 0, 0, 0, 0, 0, 0)]  # num dwell delay freqPPM phasePPM freq phase phase_id
    else:  # amp mag phase time delay freq phase
        rf = [(1, _rect_hz(90.0, 100), 1, 0, 0, 0, freq, phase), (2, _rect_hz(180.0, 100), 1, 0, 0, 0, 0.0, 0.0)]
        adc = [(1, 100, 1000, 0, 0, 0)]
    rf += [r for _, r in prefix]
    # crushers on z; the select gradient on x and its rephaser
    # 1100 cycles/m: 1.1 cycles across the default 1 mm voxel
    trap = [(1, 1e6, 100, 1000, 100, 200), (3, 1e4, 0, 100, 0, 0), (4, -0.5e4, 0, 100, 0, 0)]
    return _seq(path, blocks, rf, trap, adc, [(1, np.ones(100))], version=version, **kw)


def test_decompress_shape_against_the_run_length_rule():
    np.testing.assert_array_equal(decompress_shape([1.0, 0.0, 0.0, 97.0], 100), np.ones(100))
    np.testing.assert_allclose(decompress_shape([0.5, 0.5, 3.0], 5), [0.5, 1.0, 1.5, 2.0, 2.5])
    np.testing.assert_array_equal(decompress_shape([3.0, 1.0, 4.0], 3), [3.0, 1.0, 4.0])  # stored whole
    with pytest.raises(ValueError, match="decompresses to 2 samples"):
        decompress_shape([1.0, 1.0, 0.0], 5)
    with pytest.raises(ValueError, match="negative count"):
        decompress_shape([1.0, 1.0, -4.0], 5)
    with pytest.raises(ValueError, match="without its count"):
        decompress_shape([2.0, 1.0, 1.0], 5)


def test_decompress_shape_against_pypulseq():
    """Shapes with runs of every length (plateaus, ramps, counts equal to
    the neighbouring values) compressed by pypulseq and read back."""
    compress_shape = pytest.importorskip("pypulseq.compress_shape").compress_shape
    rng = np.random.default_rng(3)
    for _ in range(50):
        steps = np.repeat(rng.integers(-3, 4, 40) * 0.25, rng.integers(1, 9, 40))
        shape = np.cumsum(steps)
        c = compress_shape(shape, force_compression=True)
        np.testing.assert_allclose(decompress_shape(c.data, int(c.num_samples)), shape, atol=1e-9)


@pytest.mark.parametrize("rf", ["hard", "shaped"])
def test_spin_echo_file_against_the_closed_form(tmp_path, rf):
    sim = Simulator.from_pulseq(_spin_echo(tmp_path / "se.seq"), rf=rf)
    T2 = np.array([40.0, 90.0])
    s = sim.simulate(T1=1000.0, T2=T2, M0=1.5)
    tol = 1e-5 if rf == "hard" else 2e-3  # shaped: relaxation during the 0.1 ms pulses
    # the file's 90° at phase +90° is SPEC's at -90° (the format counts phase the other way round): F+ = -1
    np.testing.assert_allclose(s[:, 0], -1.5 * np.exp(-20.0 / T2), rtol=tol, atol=tol)
    # B0 refocuses at the spin echo
    np.testing.assert_allclose(sim.simulate(T1=1000.0, T2=T2, B0=37.0)[:, 0], -np.exp(-20.0 / T2), rtol=tol,
                               atol=tol)
    # the crushers as ideal spoilers leave no echo; a handler shifting once per crusher gives it back
    assert abs(Simulator.from_pulseq(tmp_path / "se.seq", dephasing="spoil").simulate(T2=60.0)[0]) < 1e-7
    handler = Simulator.from_pulseq(tmp_path / "se.seq", rf=rf,
                                    dephasing=lambda b: int(not b.rf and not b.adc and b.moment[2] > 0))
    np.testing.assert_allclose(handler.simulate(T2=60.0)[0], -np.exp(-20.0 / 60.0), rtol=tol)


def test_arbitrary_gradient_crushers_read_as_their_moment(tmp_path):
    """The spin echo with its crushers written as arbitrary gradients
    (samples on the gradient raster) of the traps' moment, and as
    piecewise-linear corner points (a time shape): the same echo."""
    se = _spin_echo(tmp_path / "se.seq").read_text()
    want = Simulator.from_pulseq(tmp_path / "se.seq").simulate(T2=60.0, T1=1000.0)
    moment = 1e6 * 1.1e-3  # the trap's: 100 us rise, 1000 us flat, 100 us fall at 1e6 Hz/m
    held = se.replace("[TRAP]\n1 ", "[GRADIENTS]\n1 %r 2 0 200\n\n[TRAP]\n9 " % (moment / (110 * 1e-5)))
    held = held.replace("[SHAPES]\n", "[SHAPES]\n\nshape_id 2\nnum_samples 110\n" + "1.0\n" * 110, 1)
    (tmp_path / "held.seq").write_text(held)
    np.testing.assert_allclose(Simulator.from_pulseq(tmp_path / "held.seq").simulate(T2=60.0, T1=1000.0), want,
                               rtol=1e-6)
    # corners at 0, 10, 110 and 120 rasters (10 us): the trapezoid itself
    corners = se.replace("[TRAP]\n1 ", "[GRADIENTS]\n1 1000000.0 3 4 200\n\n[TRAP]\n9 ")
    corners = corners.replace("[SHAPES]\n", "[SHAPES]\n\nshape_id 3\nnum_samples 4\n0.0\n1.0\n1.0\n0.0\n\n"
                              "shape_id 4\nnum_samples 4\n0.0\n10.0\n110.0\n120.0\n", 1)
    (tmp_path / "corners.seq").write_text(corners)
    np.testing.assert_allclose(Simulator.from_pulseq(tmp_path / "corners.seq").simulate(T2=60.0, T1=1000.0), want,
                               rtol=1e-6)
    # the blocks' net moments as a handler sees them: the two crushers, 1100 cycles/m on z
    for name in ("se.seq", "held.seq", "corners.seq"):
        seen = []
        Simulator.from_pulseq(tmp_path / name, dephasing=lambda b: seen.append(b.moment.copy()) or 0).simulate(T2=60.0)
        np.testing.assert_allclose(np.array(seen)[[1, 3]], [[0.0, 0.0, moment]] * 2, rtol=1e-12, err_msg=name)


def test_uncompressed_shapes_read_the_same(tmp_path):
    a = Simulator.from_pulseq(_spin_echo(tmp_path / "a.seq")).simulate(T2=60.0)
    b = Simulator.from_pulseq(_spin_echo(tmp_path / "b.seq", compress=False)).simulate(T2=60.0)
    np.testing.assert_array_equal(a, b)


def test_rf_spoiled_gradient_echo_file_against_the_isochromat_ensemble(tmp_path):
    """Per TR: pulse at the quadratic RF-spoiling phase, readout prephaser
    (-A), readout (2A) with the ADC at its centre and phase following the
    RF, spoiler (A), all along z: the moment logic puts the echo at the
    ADC centre and two shifts in every TR."""
    n, flip, inc = 40, 15.0, 117.0
    phases = np.radians(inc * np.arange(n) * (np.arange(n) + 1) / 2) % (2 * np.pi)
    blocks, rf, adc = [], [], []
    for k in range(n):
        blocks += [(4 * k + 1, 10, k + 1, 0, 0, 0, 0, 0), (4 * k + 2, 100, 0, 0, 0, 1, 0, 0),
                   (4 * k + 3, 84, 0, 0, 0, 2, k + 1, 0), (4 * k + 4, 706, 0, 0, 0, 3, 0, 0)]
        rf.append((k + 1, _rect_hz(flip, 100), 1, 0, 0, 0, 0.0, phases[k]))
        adc.append((k + 1, 64, 10000, 100, 0, phases[k]))
    trap = [(1, -1e6, 100, 640, 100, 0), (2, 2e6, 100, 640, 100, 0), (3, 1e6, 100, 640, 100, 0)]
    path = _seq(tmp_path / "gre.seq", blocks, rf, trap, adc, [(1, np.ones(100))])
    sim = Simulator.from_pulseq(path)
    t = dict(T1=900.0, T2=70.0, B1=0.9, B0=12.0, M0=1.2)
    s = sim.simulate(**t)
    TE = 0.05 + 1.0 + 0.42  # ms from the pulse centre to the ADC centre
    # the file's phases enter negated (SPEC's frame); the oracle's receiver
    # is at its RF phase - 90°, the file's at the RF phase
    ref = _flash_isochromats(np.full(n, flip), 9.0, TE, n, -inc, **t)
    np.testing.assert_allclose(s, -1j * ref, atol=3e-6)
    # the Jacobian of a file, against the oracle's central differences
    _, J = sim.jacobian(("T1", "B1"), **t)
    for i, (k, h) in enumerate((("T1", 1.0), ("B1", 1e-4))):
        up = _flash_isochromats(np.full(n, flip), 9.0, TE, n, -inc, **{**t, k: t[k] + h})
        dn = _flash_isochromats(np.full(n, flip), 9.0, TE, n, -inc, **{**t, k: t[k] - h})
        np.testing.assert_allclose(J[i], -1j * (up - dn) / (2 * h), rtol=1e-3, atol=2e-6)


@pytest.mark.parametrize("rf", ["hard", "shaped"])
def test_format_1_5_slice_offsets_and_ppm_offsets(tmp_path, rf):
    """The same spin echo written in format 1.5; its 90° moved 2 kHz off
    (a slice offset) under a select gradient, with and without the phase
    offset -2 pi f t_centre that cancels the frequency's phase at the pulse
    centre (as pypulseq's examples write it); and a fat-saturation pulse at
    -3.4 ppm (no gradient) before it, which hard mode refuses."""
    want = -np.exp(-20.0 / 60.0)
    tol = 1e-5 if rf == "hard" else 2e-3
    v15 = Simulator.from_pulseq(_spin_echo(tmp_path / "v15.seq", version=(1, 5, 0)), rf=rf)
    np.testing.assert_allclose(v15.simulate(T2=60.0)[0], want, rtol=tol)
    f, tc = 2000.0, 50e-6
    cancelled = _spin_echo(tmp_path / "sel.seq", freq=f, select=True, phase=np.pi / 2 - 2 * np.pi * f * tc)
    np.testing.assert_allclose(Simulator.from_pulseq(cancelled, rf=rf).simulate(T2=60.0)[0], want, rtol=tol)
    # uncancelled, the 90° acts at phase 90° + 2 pi f tc in the file's frame (SPEC's -90° - 2 pi f tc): the echo
    # conj(-exp(-i (2 pi f tc))) turns by 2 pi f tc
    raw = Simulator.from_pulseq(_spin_echo(tmp_path / "raw.seq", freq=f, select=True), rf=rf).simulate(T2=60.0)[0]
    np.testing.assert_allclose(raw, want * np.exp(2j * np.pi * f * tc), rtol=tol, atol=tol)
    fatsat = ((1, 500, 3, 0, 0, 0, 0, 0), (3, _rect_hz(90.0, 100), 1, 0, 0, 50, 0, -3.4, 0, 0, 0.0, "s"))
    path = _spin_echo(tmp_path / "fs.seq", version=(1, 5, 0), prefix=(fatsat,))
    if rf == "hard":
        with pytest.raises(PulseqError, match="block 1: RF 3 cannot be played as a hard pulse: it is -434.* Hz "
                                              "off resonance without a gradient"):
            Simulator.from_pulseq(path, field_strength=3.0, rf="hard").simulate(T2=60.0)
    else:
        # auto: the fat saturation shaped, the rest hard (relaxation during the 0.1 ms pulses apart)
        np.testing.assert_allclose(Simulator.from_pulseq(path, field_strength=3.0).simulate(T2=60.0),
                                   Simulator.from_pulseq(path, field_strength=3.0, rf=rf).simulate(T2=60.0), atol=tol)
    with pytest.raises(PulseqError, match="RF 3 has a frequency offset of -3.4 ppm: give field_strength"):
        Simulator.from_pulseq(path, rf=rf).simulate(T2=60.0)


def test_pulseq_refusals(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Pulseq file"):
        Simulator.from_pulseq(tmp_path / "missing.seq")
    with pytest.raises(PulseqError, match="version 1.2 is not read"):
        Simulator.from_pulseq(_spin_echo(tmp_path / "old.seq", version=(1, 2, 0)))
    se = _spin_echo(tmp_path / "se.seq")
    with pytest.raises(ValueError, match="rf must be 'auto', 'hard' or 'shaped', got 'soft'"):
        Simulator.from_pulseq(se, rf="soft")
    with pytest.raises(ValueError, match="dephasing must be"):
        Simulator.from_pulseq(se, dephasing="crush")
    with pytest.raises(ValueError, match="axis must be"):
        Simulator.from_pulseq(se, axis="w")
    with pytest.raises(TypeError, match="must return an int for block 1"):
        Simulator.from_pulseq(se, dephasing=lambda b: 0.5)
    with pytest.raises(TypeError, match="unit"):
        Simulator.from_pulseq(se, unit="large")
    with pytest.raises(ValueError, match="field_strength must be > 0 T"):
        Simulator.from_pulseq(se, field_strength=-3.0)
    bad = tmp_path / "bad.seq"
    bad.write_text(se.read_text().replace("[RF]\n1 ", "[RF]\n1 x"))
    with pytest.raises(PulseqError, match="bad.seq, line .*cannot read"):
        Simulator.from_pulseq(bad)
    hole = tmp_path / "hole.seq"
    hole.write_text(se.read_text().replace("shape_id 1", "shape_id 7"))
    with pytest.raises(PulseqError, match="names shape 1"):
        Simulator.from_pulseq(hole)
    assert isinstance(PulseqBlock(1, 0.0, 1e-3, False, False), PulseqBlock)


def test_times_off_their_raster_are_read_as_written(tmp_path):
    """As pypulseq reads them, with a warning that names the line: a
    trapezoid's ramp off the gradient raster plays as the same file whose
    declared raster holds it; an RF delay of half a cell moves the
    excitation by half a microsecond."""
    se = _spin_echo(tmp_path / "se.seq").read_text()
    tissue = dict(T1=800.0, T2=60.0, B0=7.0)
    off = se.replace("[TRAP]\n1 1000000.0 100.0 1000.0 100.0 200.0", "[TRAP]\n1 1000000.0 105.0 1000.0 100.0 200.0")
    (tmp_path / "off.seq").write_text(off)
    (tmp_path / "fine.seq").write_text(off.replace("GradientRasterTime 1e-05", "GradientRasterTime 5e-06"))
    with pytest.warns(PulseqWarning, match=r"line \d+: trapezoid 1's times are not on the gradient raster "
                                           r"\(1e-05 s\); read as written"):
        got = Simulator.from_pulseq(tmp_path / "off.seq").simulate(**tissue)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PulseqWarning)
        np.testing.assert_array_equal(got, Simulator.from_pulseq(tmp_path / "fine.seq").simulate(**tissue))
    row = se[se.index("[RF]\n") + 5:].splitlines()[0]
    fields = row.split()
    fields[5] = "0.5"  # delay, us, half a cell of the 1 us RF raster
    (tmp_path / "late.seq").write_text(se.replace(row, " ".join(fields)))
    with pytest.warns(PulseqWarning, match=r"line \d+: RF 1's delay is not on the RF raster \(1e-06 s\)"):
        late = Simulator.from_pulseq(tmp_path / "late.seq").simulate(**tissue)
    was = Simulator.from_pulseq(tmp_path / "se.seq").simulate(**tissue)
    # the excitation half a microsecond later: δ less T2 decay, the echo turned back by 2π B0 δ
    np.testing.assert_allclose(np.abs(late) / np.abs(was), np.exp(0.5e-6 / 60e-3), rtol=1e-6)
    np.testing.assert_allclose(np.angle(late / was), -2 * np.pi * 7.0 * 0.5e-6, rtol=0.02)


def test_malformed_files_are_refused_naming_the_place(tmp_path):
    se = _spin_echo(tmp_path / "se.seq").read_text()

    def refused(text, match, name="bad.seq"):
        (tmp_path / name).write_text(text)
        with pytest.raises(PulseqError, match=match):
            Simulator.from_pulseq(tmp_path / name).simulate(T2=60.0)

    refused(se.replace("minor 4", "minor 7"), "version 1.7 is not read")
    refused(se.replace("[VERSION]\nmajor 1\nminor 4", "[VERSION]\nmajor 1"), "no \\[VERSION\\] section")
    # a truncated row, a truncated shape, a truncated file
    refused(se.replace("[TRAP]\n1 1000000.0 100.0 1000.0 100.0 200.0", "[TRAP]\n1 1000000.0 100.0 1000.0 100.0"),
            r"line \d+: \[TRAP\] row 1 has 4 numbers after its id, version 1.4 has 5")
    refused(se.replace("num_samples 100\n1.0\n0.0\n0.0\n97.0", "num_samples 100\n1.0\n0.0\n0.0"),
            r"line \d+: shape 1: a repeated value ends the shape without its count")
    refused(se[:se.index("[SHAPES]")], "names shape 1, which \\[SHAPES\\] does not hold")
    refused(se.replace("[BLOCKS]\n1 10 1 0 0 0 0 0", "[BLOCKS]\n1 10 1 0 0 0 0"), r"line \d+: a block has 7 fields")
    refused(se.replace("[BLOCKS]\n1 10 1 0 0 0 0 0", "[BLOCKS]\n1 10 9 0 0 0 0 0"),
            "block 1 names RF event 9, which \\[RF\\] does not hold")
    refused(se.replace("5 10 0 0 0 0 1 0", "5 10 0 0 0 0 4 0"), "block 5 names ADC event 4, which \\[ADC\\] does not hold")
    refused(se.replace("2 990 0 0 0 1 0 0", "2 990 0 0 0 6 0 0"), "block 2 names gradient 6, which neither")
    refused(se.replace("[RF]\n1 ", "[RF\n1 "), r"line \d+: malformed section header")
    refused(se.replace("BlockDurationRaster 1e-05", "BlockDurationRaster -1"), "BlockDurationRaster must be > 0")
    # a long section (parsed as one table) with a row out of shape or a word in it: named all the same
    spare = "\n".join(f"{i} 1000.0 100.0 1000.0 100.0 0.0" for i in range(10, 90))
    long = se.replace("[TRAP]\n", "[TRAP]\n" + spare + "\n")
    (tmp_path / "long.seq").write_text(long)
    np.testing.assert_allclose(Simulator.from_pulseq(tmp_path / "long.seq").simulate(T2=60.0),
                               Simulator.from_pulseq(tmp_path / "se.seq").simulate(T2=60.0))
    refused(long.replace("\n50 1000.0 100.0 1000.0 100.0 0.0", "\n50 1000.0 100.0 1000.0 100.0"),
            r"line \d+: \[TRAP\] row 50 has 4 numbers after its id")
    refused(long.replace("\n50 1000.0 100.0", "\n50 1000.0 fast"), r"line \d+: cannot read '50 1000.0 fast")


def test_moments_are_never_rounded(tmp_path):
    """A crusher pair whose second lobe is 3 % larger than the first (33
    cycles/m, 0.033 cycles across the default 1 mm voxel) has no common unit
    with it: refused, naming the block, with a given unit; by default its
    states are keyed by their exact moment (no rounding), and the spin echo,
    33 cycles/m from the origin, is dephased as the EPG dephases every
    state off its moment cell; a unit that divides both plays."""
    se = _spin_echo(tmp_path / "se.seq").read_text()
    uneven = se.replace("[TRAP]\n1 1000000.0", "[TRAP]\n5 1030000.0 100.0 1000.0 100.0 200.0\n1 1000000.0").replace(
        "4 990 0 0 0 1 0 0", "4 990 0 0 0 5 0 0")
    (tmp_path / "uneven.seq").write_text(uneven)
    from blochsim.pulseq import read_pulseq

    assert any(type(op).__name__ == "_Moment" for op in read_pulseq(tmp_path / "uneven.seq"))
    assert abs(Simulator.from_pulseq(tmp_path / "uneven.seq").simulate(T2=60.0)[0]) < 1e-7
    with pytest.raises(PulseqError, match=r"block 5: the gradient moment .* is not a whole number of unit = 1100 "
                                          "cycles/m: it would be rounded"):
        Simulator.from_pulseq(tmp_path / "uneven.seq", unit=1100.0).simulate(T2=60.0)
    # the same file with crushers of 1100 and 2200 cycles/m (unit 1100): the echo is gone, exactly
    double = se.replace("[TRAP]\n1 1000000.0", "[TRAP]\n5 2000000.0 100.0 1000.0 100.0 200.0\n1 1000000.0").replace(
        "4 990 0 0 0 1 0 0", "4 990 0 0 0 5 0 0")
    (tmp_path / "double.seq").write_text(double)
    assert abs(Simulator.from_pulseq(tmp_path / "double.seq").simulate(T2=60.0)[0]) < 1e-7
    # a remainder of 0.55 cycles/m (5.5e-4 cycles across the 1 mm voxel) is within the tolerance: the echo is kept
    close = se.replace("[TRAP]\n1 1000000.0", "[TRAP]\n5 1000500.0 100.0 1000.0 100.0 200.0\n1 1000000.0").replace(
        "4 990 0 0 0 1 0 0", "4 990 0 0 0 5 0 0")
    (tmp_path / "close.seq").write_text(close)
    np.testing.assert_allclose(Simulator.from_pulseq(tmp_path / "close.seq").simulate(T2=60.0)[0],
                               -np.exp(-20.0 / 60.0), rtol=1e-5)


def test_crusher_geometry_follows_from_the_unit(tmp_path):
    """With voxel_size_m the crusher geometry is 2 pi |unit| voxel: D acts
    on the spin echo as exp(-D k^2 Delta), k the crushers' wavenumber and
    Delta the time between their centres, where the shifts are placed
    (SPEC's gradients are instantaneous: Stejskal-Tanner's Delta - delta/3
    with delta -> 0)."""
    path = _spin_echo(tmp_path / "se.seq")
    sim = Simulator.from_pulseq(path, voxel_size_m=1e-3)
    D = 2.0  # um^2/ms
    s = sim.simulate(T1=1e6, T2=1e6, D=D)[0]
    k = 2 * np.pi * 1100.0  # rad/m, one unit
    # each crusher: block start + 200 us delay + (100 us rise, 1000 us flat, 100 us fall) / 2; the blocks
    # start at 0.1 ms and 10.1 ms
    delta = (10.1e-3 + 0.8e-3) - (0.1e-3 + 0.8e-3)
    want = np.exp(-D * 1e-9 * k ** 2 * delta)
    np.testing.assert_allclose(abs(s), want, rtol=1e-4)


def test_dephasing_direction_short_and_long_trains():
    """The primitive direction of proportional integer moments (the
    short-train and long-train paths agree), and None where rows are not
    proportional."""
    from blochsim.pulseq.reader import _Reader
    rng = np.random.default_rng(5)
    g = np.array([2, -3, 0])
    for n in (10, 500):
        q = rng.integers(-4, 5, n)
        q[0] = 0
        N = np.outer(q, g)
        found = _Reader._direction(N)
        assert found is not None and (np.array_equal(found, g) or np.array_equal(found, -g))
        assert found[np.flatnonzero(found)[0]] > 0
        N[-1, 2] = 1  # one row off the line
        assert _Reader._direction(N) is None
        assert np.array_equal(_Reader._direction(np.zeros((n, 3), np.int64)), np.zeros(3))
