"""The main job (``python -m blochsim``) at a small size: the phantom, the
maps by dictionary matching and PERK against the phantom's truth, the table
and the picture; the phantom itself; the command's refusals."""
import numpy as np
import pytest

from blochsim._engine import dispatch as _dispatch
from blochsim.cli import build_parser, main, maps_job
from blochsim.phantom import TISSUES, brain_phantom


def test_phantom_classes_and_fields():
    ph = brain_phantom(64)
    assert ph["T1"].shape == (64, 64) and ph["mask"].sum() > 0.5 * 64 * 64
    for i, (name, values) in enumerate(TISSUES.items()):
        inside = ph["label"] == i + 1
        assert inside.sum() > 20, name
        for k, v in values.items():
            assert np.all(ph[k][inside] == v)
    b1 = ph["B1"][ph["mask"]]
    assert 0.8 < b1.min() < 0.9 and 1.1 < b1.max() <= 1.15
    assert np.all(ph["T1"][~ph["mask"]] == 0) and np.all(ph["B1"][~ph["mask"]] == 0)
    with pytest.raises(ValueError, match="size must be an integer >= 8, got 4"):
        brain_phantom(4)


def test_maps_job_errors_table_and_picture(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "maps.png"
    args = build_parser().parse_args(["--size", "40", "--trs", "200", "--quiet", "--maps", str(png),
                                      "--save-dictionary", str(tmp_path / "d.npz")])
    status, errors = maps_job(args, "cpu", _dispatch.backends())
    assert status == 0
    out = capsys.readouterr().out
    assert "median |error| / truth" in out and "dictionary" in out and "PERK" in out
    d = errors["dictionary"]
    assert d["T1"] < 0.05 and d["T2"] < 0.10 and d["M0"] < 0.05, d
    # PERK's log-scaled ranges cover every tissue, CSF (T1 4000, T2 2000 ms) included; a 2 s train
    # (200 TRs) determines T2 of 2000 ms only coarsely
    for name in ("white matter", "grey matter", "fat"):
        for k in ("T1", "T2", "M0"):
            assert errors["PERK"]["tissues"][name][k] < 0.08, (name, k, errors["PERK"]["tissues"][name])
            assert errors["dictionary"]["tissues"][name][k] < 0.10, (name, k)
    csf = errors["PERK"]["tissues"]["CSF"]
    assert csf["T1"] < 0.10 and csf["T2"] < 0.5 and csf["M0"] < 0.05, csf
    assert "beyond PERK's training ranges" not in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "d.npz").stat().st_size < 50e6


@pytest.mark.parametrize("argv, message", [
    (["--size", "4"], "--size must be >= 8, got 4"),
    (["--noise", "-1"], "--noise must be >= 0, got -1.0"),
    (["--trs", "0"], "--trs must be >= 1, got 0"),
])
def test_main_job_refusals(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_readme_command_runs_from_the_source_folder():
    """``python -m blochsim`` from the folder the README's set-up commands
    run in: that folder's blochsim/ (no compiled extension where the package
    was installed with ``pip install .``) hands over to the installed one."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    if not (root / "blochsim" / "__init__.py").is_file():
        pytest.skip("not run from a source folder")
    r = subprocess.run([sys.executable, "-m", "blochsim", "--help"], cwd=root, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "usage: blochsim" in r.stdout
    r = subprocess.run([sys.executable, "-c", "import blochsim; print(blochsim._core.TISSUE_FIELDS[0])"], cwd=root,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "T1_s", r.stderr
