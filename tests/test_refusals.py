"""Every refusal of SPEC §8 that the host engine can meet: a clear
exception naming the parameter and the value, before any kernel runs."""
import numpy as np
import pytest

import blochsim
from blochsim import Delay, Dephase, Pulse, Readout, SampledPulse, Simulator
from blochsim.simulators import FSESimulator, MRFSimulator, SPGRSimulator, StimulatedEchoSimulator, bSSFPSimulator

FLIP = np.full(8, 180.0)


def fse(**kw):
    return FSESimulator(ESP=5.0, **kw)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_tissue(bad):
    with pytest.raises(ValueError, match=r"T2 must be finite.*(nan|inf)"):
        fse().simulate(flip=FLIP, T1=1000.0, T2=np.array([80.0, bad]))


def test_nan_protocol():
    with pytest.raises(ValueError, match=r"flip must be finite"):
        fse().simulate(flip=np.array([180.0, np.nan]), T2=80.0)
    with pytest.raises(ValueError, match=r"ESP must be finite"):
        FSESimulator(ESP=np.inf)


@pytest.mark.parametrize("name", ["T1", "T2"])
@pytest.mark.parametrize("value", [0.0, -5.0])
def test_nonpositive_relaxation_times(name, value):
    kw = {"T1": 1000.0, "T2": 80.0, name: np.array([50.0, value])}
    with pytest.raises(ValueError, match=rf"{name} must be > 0 ms, got {value!r} at index \(1,\)"):
        fse().simulate(flip=FLIP, **kw)


def test_negative_diffusion():
    sim = fse(crusher_dephasing_rad=2 * np.pi, voxel_size_m=1e-3)
    with pytest.raises(ValueError, match=r"D must be >= 0"):
        sim.simulate(flip=FLIP, T2=80.0, D=-1.0)


def test_unknown_property_names():
    with pytest.raises(TypeError, match=r"unknown keyword 'T3'"):
        fse().simulate(flip=FLIP, T3=1.0)
    # a known property the simulator does not model is refused, never ignored
    with pytest.raises(TypeError, match=r"does not model tissue property 'inv_efficiency'"):
        fse().simulate(flip=FLIP, T2=80.0, inv_efficiency=0.9)
    with pytest.raises(TypeError, match=r"does not model tissue property 'B0'"):
        StimulatedEchoSimulator(TE=20.0, TM=50.0).simulate(T1=1000.0, T2=80.0, B0=3.0)
    with pytest.raises(TypeError, match=r"no protocol parameter 'TEE'"):
        FSESimulator(ESP=5.0, TEE=3.0)
    with pytest.raises(TypeError, match=r"T1 is a tissue property"):
        FSESimulator(ESP=5.0, T1=3.0)


def test_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"do not broadcast.*T1 \(3,\).*T2 \(4,\)"):
        fse().simulate(flip=FLIP, T1=np.ones(3) * 900, T2=np.ones(4) * 80)


@pytest.mark.parametrize("arr", [np.array([1000, 2000]), np.array([1 + 0j]), np.array([True])])
def test_non_float_dtypes(arr):
    with pytest.raises(TypeError, match=r"T1 must .*(floating|real)"):
        fse().simulate(flip=FLIP, T1=arr, T2=80.0)


def test_non_float_objects():
    with pytest.raises(TypeError, match=r"T2 must be"):
        fse().simulate(flip=FLIP, T2="80")
    with pytest.raises(TypeError, match=r"T2 must be"):
        fse().simulate(flip=FLIP, T2=True)


@pytest.mark.parametrize("prop", ["D", "v"])
def test_diffusion_or_flow_without_geometry(prop):
    class DV(Simulator):
        tissue_properties = ("T2", "D", "v")

        def repetition(self, p):
            return Readout() @ Delay(5.0) @ Dephase() @ Pulse(90.0)

    with pytest.raises(ValueError, match=rf"{prop} needs the crusher geometry.*crusher_dephasing_rad=None"):
        DV().simulate(**{prop: 1.0})
    with pytest.raises(ValueError, match=rf"{prop} needs the crusher geometry.*voxel_size_m=None"):
        DV(crusher_dephasing_rad=np.pi).simulate(**{prop: 1.0})


@pytest.mark.parametrize("states", [0, -3])
def test_states_below_one(states):
    with pytest.raises(ValueError, match=rf"states must be >= 1, got {states}"):
        fse(states=states)


@pytest.mark.parametrize("states", [2.5, "8", True])
def test_states_not_an_integer(states):
    with pytest.raises(TypeError, match=r"states must be an integer"):
        fse(states=states)


def test_bad_geometry():
    with pytest.raises(ValueError, match=r"voxel_size_m must be > 0"):
        fse(voxel_size_m=0.0)
    with pytest.raises(ValueError, match=r"crusher_dephasing_rad must be > 0"):
        fse(crusher_dephasing_rad=-1.0)


def test_protocol_refusals():
    with pytest.raises(ValueError, match=r"ESP must be > 0 ms, got -1.0"):
        FSESimulator(ESP=-1.0)
    with pytest.raises(ValueError, match=r"TR must be >= n_echoes \* ESP = 40 ms, got 30"):
        FSESimulator(ESP=5.0, TR=30.0).simulate(flip=FLIP)
    with pytest.raises(ValueError, match=r"phases must have 8 entries, got 3"):
        fse().simulate(flip=FLIP, phases=np.zeros(3))
    with pytest.raises(ValueError, match=r"TR must have 8 entries"):
        MRFSimulator(flip=FLIP, TR=np.ones(5))
    with pytest.raises(TypeError, match=r"needs protocol parameter 'flip'"):
        fse().simulate(T2=80.0)
    with pytest.raises(ValueError, match=r"TE must be <= TR"):
        bSSFPSimulator(flip=30.0, TR=5.0, TE=6.0)
    with pytest.raises(TypeError, match=r"needs tissue property 'T1'"):
        SPGRSimulator(flip=10.0, TR=10.0).simulate(M0=1.0)
    with pytest.raises(ValueError, match=r"repetitions must be >= 1"):
        fse(repetitions=0)
    with pytest.raises(ValueError, match=r"threads must be >= 1"):
        fse(threads=0)


def test_operator_refusals():
    with pytest.raises(ValueError, match=r"Delay duration must be a scalar >= 0 ms"):
        Delay(-1.0)
    with pytest.raises(ValueError, match=r"flip must be finite"):
        Pulse(np.nan)
    with pytest.raises(TypeError, match=r"Dephase orders must be an integer"):
        Dephase(1.5)
    with pytest.raises(ValueError, match=r"dwell must be > 0"):
        SampledPulse(np.ones(4), dwell=0.0)
    with pytest.raises(TypeError, match=r"holds Operators"):
        blochsim.Sequence([Pulse(90.0), "not an op"])


def test_cuda_requested_without_cuda():
    if blochsim.backends()["cuda"]["available"]:
        pytest.skip("CUDA is usable here")
    with pytest.raises(RuntimeError, match=r"device='cuda'.*cannot run: .*CUDA"):
        FSESimulator(ESP=5.0, device="cuda").simulate(flip=FLIP, T2=80.0)
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'cuda' or 'auto', got 'tpu'"):
        FSESimulator(ESP=5.0, device="tpu")


class _FakeDeviceArray:
    """Exposes the CUDA array interface without any GPU behind it."""

    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_device_array_without_cuda():
    if blochsim.backends()["cuda"]["available"]:
        pytest.skip("CUDA is usable here")
    with pytest.raises(RuntimeError, match=r"T2 is a device array.*cannot run"):
        fse().simulate(flip=FLIP, T2=_FakeDeviceArray())


def test_refusal_leaves_no_partial_output():
    sim = fse()
    good = sim.simulate(flip=FLIP, T2=80.0)
    with pytest.raises(ValueError):
        sim.simulate(flip=FLIP, T2=np.array([80.0, -1.0]))
    np.testing.assert_array_equal(sim.simulate(flip=FLIP, T2=80.0), good)


def test_core_rechecks_the_stream():
    from blochsim import _core
    from blochsim.sequence import EventStream

    s = EventStream()
    s.interval = np.array([5], np.int32)  # no interval table: index out of range
    s.flags = np.array([4], np.uint32)
    s.shift_before = s.shift_after = s.slot = np.zeros(1, np.int32)
    s.flip_rad = s.phase_rad = s.rx_phase_rad = np.zeros(1, np.float32)
    s.duration_s = np.zeros(0)
    s.rf_table = None
    s.n_samples = 1
    out = np.zeros((1, 1), np.complex64)
    with pytest.raises(ValueError, match="interval index"):
        _core.forward_host(_core.PackedStream(s, 8, 0.0, 0.0, True, 0.0), (None,) * 9, 1, out, 1)
    s.interval = np.array([-1], np.int32)
    with pytest.raises(ValueError, match="states must be >= 1"):
        _core.forward_host(_core.PackedStream(s, 0, 0.0, 0.0, True, 0.0), (None,) * 9, 1, out, 1)


@pytest.mark.parametrize("name, ok, bad", [
    ("T2", [1e-30, 80.0], [0.0, -0.0, -1e-30]),             # > 0 ms
    ("D", [0.0, -0.0, 3.0], [-1e-30]),                      # >= 0
    ("fat_fraction", [0.0, 1.0], [np.nextafter(1.0, 2.0)]),  # <= 1
    ("B0", [-1e6, 1e6], [np.nextafter(1e6, 2e6), -np.nextafter(1e6, 2e6)]),  # within +-1e6 Hz
    ("M0", [-1e30, 3.0], [np.nextafter(1e30, 2e30)]),
])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tissue_bounds_hold_at_their_edges(name, ok, bad, dtype):
    """The tissue checks take the least and greatest value of an array first
    and its values one by one only to name a failure: at each bound's edge
    both agree, alone and inside a larger (or broadcast) array."""
    from blochsim._arrays.validate import tissue_array

    base = np.full(7, 0.5 if name == "fat_fraction" else 1.0, dtype)

    def exact(values):  # the edges this dtype holds
        return [v for v in values if float(dtype(v)) == v]

    for v in exact(ok):
        tissue_array(name, np.asarray(v, dtype))
        arr = base.copy()
        arr[3] = v
        tissue_array(name, arr)
        tissue_array(name, np.broadcast_to(arr, (1000, 7)))
    for v in exact(bad):
        arr = base.copy()
        arr[3] = v
        with pytest.raises(ValueError, match=rf"{name} must .* at index \(3,\)"):
            tissue_array(name, arr)
        with pytest.raises(ValueError, match=rf"{name} must"):
            tissue_array(name, np.asarray(v, dtype))


def test_tissue_checks_of_empty_and_nan_arrays():
    from blochsim._arrays.validate import tissue_array

    assert tissue_array("T1", np.empty((0, 3))).shape == (0, 3)
    big = np.full((4, 1000), 900.0, np.float32)
    big[2, 777] = np.nan
    with pytest.raises(ValueError, match=r"T1 must be finite, got nan at index \(2, 777\)"):
        tissue_array("T1", big)
    with pytest.raises(ValueError, match=r"T1 must be finite, got nan at index \(0, 1\)"):
        tissue_array("T1", np.broadcast_to(np.array([900.0, np.nan]), (10**6, 2)))
