"""Simulator.to_pulseq: trains written as Pulseq files through pypulseq
(the format's reference implementation, a test dependency), checked by
pypulseq's own reader and timing check, and read back by
Simulator.from_pulseq: the same samples as the simulator's (the file's
phases carry six digits: 5e-5 of M0)."""
import numpy as np
import pytest

pp = pytest.importorskip("pypulseq")

from blochsim import Simulator  # noqa: E402
from blochsim.simulators import (FLASHSimulator, FSESimulator, IRbSSFPSimulator, MRFSimulator,  # noqa: E402
                                 SPGRSimulator, TrueFISPSimulator)

TISSUE = dict(T1=np.array([900.0, 1500.0]), T2=np.array([70.0, 40.0]), B1=np.array([1.0, 0.9]),
              B0=np.array([0.0, 7.0]))
TOL = 5e-5

TRAINS = {
    "spin-echo train": lambda: FSESimulator(ESP=10.0, flip=np.linspace(180.0, 120.0, 12)),
    "RF-spoiled FLASH": lambda: FLASHSimulator(flip=np.full(30, 12.0), TR=6.0, TE=2.0),
    "MRF-FISP after an inversion": lambda: MRFSimulator(flip=np.linspace(5.0, 50.0, 40), TR=10.0, TI=20.0, TE=2.0,
                                                        states=16),
    "bSSFP": lambda: TrueFISPSimulator(flip=40.0, TR=5.0, nshots=40),
    "inversion-recovery bSSFP": lambda: IRbSSFPSimulator(flip=35.0, TR=4.0, nshots=30, TI=50.0),
}


@pytest.mark.parametrize("name", list(TRAINS))
def test_written_trains_read_back_to_the_same_samples(tmp_path, name):
    sim = TRAINS[name]()
    path = tmp_path / "train.seq"
    assert sim.to_pulseq(path) == str(path)
    seq = pp.Sequence()
    seq.read(str(path))
    ok, errors = seq.check_timing()
    assert ok, errors[:3]
    back = Simulator.from_pulseq(path, rf="hard")
    extra = {}
    if "inversion" in name:
        # the file's inversion is a 180° block pulse, which B1 scales: from
        # Z alone it leaves cos(B1 π) Z, the simulator's ideal inversion of
        # that efficiency
        extra["inv_efficiency"] = -np.cos(np.pi * TISSUE["B1"])
    want = sim.simulate(**TISSUE, **extra)
    got = back.simulate(**TISSUE)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_repetitions_are_written_with_the_last_playings_samples(tmp_path):
    sim = FSESimulator(ESP=8.0, flip=np.full(6, 150.0), TR=300.0)
    sim.to_pulseq(tmp_path / "fse3.seq", repetitions=3)
    back = Simulator.from_pulseq(tmp_path / "fse3.seq", rf="hard")
    np.testing.assert_allclose(back.simulate(**TISSUE), sim.simulate(**TISSUE, repetitions=3), atol=TOL, rtol=0)


def test_a_system_with_dead_times_and_its_limits(tmp_path):
    system = pp.Opts(rf_dead_time=100e-6, rf_ringdown_time=30e-6, adc_dead_time=20e-6)
    sim = FLASHSimulator(flip=np.full(10, 15.0), TR=8.0, TE=3.0)
    sim.to_pulseq(tmp_path / "flash.seq", system=system)
    back = Simulator.from_pulseq(tmp_path / "flash.seq", rf="hard")
    np.testing.assert_allclose(back.simulate(**TISSUE), sim.simulate(**TISSUE), atol=TOL, rtol=0)
    with pytest.raises(ValueError, match=r"to_pulseq: the events at .* ms overlap the block before"):
        FLASHSimulator(flip=np.full(4, 15.0), TR=8.0, TE=0.1).to_pulseq(tmp_path / "x.seq", system=system)


def test_what_cannot_be_written_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"Pulse and Readout at the same instant \(\d+ ms\) cannot both be "
                                         r"written.*give TE > 0"):
        MRFSimulator(flip=np.full(4, 10.0), TR=10.0, TI=20.0).to_pulseq(tmp_path / "x.seq")
    with pytest.raises(TypeError, match="SPGRSimulator has no played sequence to write"):
        SPGRSimulator(flip=10.0, TR=5.0).to_pulseq(tmp_path / "x.seq")
    sim = FSESimulator(ESP=10.0, flip=np.full(4, 150.0))
    with pytest.raises(ValueError, match=r"to_pulseq takes protocol values, not tissue \(T2\)"):
        sim.to_pulseq(tmp_path / "x.seq", T2=80.0)
    with pytest.raises(ValueError, match="to_pulseq: rf_duration must be > 0 and finite, got -1"):
        sim.to_pulseq(tmp_path / "x.seq", rf_duration=-1)
    with pytest.raises(ValueError, match=r"is not on the block raster \(10 us\)"):
        FSESimulator(ESP=10.003, flip=np.full(4, 150.0)).to_pulseq(tmp_path / "x.seq")
    with pytest.raises(ValueError, match="to_pulseq needs a whole number of repetitions, got 'auto'"):
        sim.to_pulseq(tmp_path / "x.seq", repetitions="auto")
