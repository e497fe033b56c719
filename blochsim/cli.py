"""The ``blochsim`` command: MR fingerprinting from dictionary to maps on a
numerical phantom, or (``--dictionary-only``) the reference dictionary
alone (SPEC §9), on the best available backend.

Examples
--------
::

    python -m blochsim                                      # phantom -> maps, errors, maps.png
    python -m blochsim --size 128 --noise 0.002
    python -m blochsim --dictionary-only --atoms 1000000    # -> dictionary.npz
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from tqdm import tqdm

from blochsim._engine import dispatch as _dispatch
from blochsim._arrays import noise as _noise
from blochsim.simulators import MRFSimulator


def reference_flips(n_tr: int = 500) -> np.ndarray:
    """Flip train of the reference workload, degrees: 5→60 then 60→2."""
    half = n_tr // 2
    return np.concatenate([np.linspace(5, 60, half), np.linspace(60, 2, n_tr - half)])


def reference_tissues(n: int):
    """First n atoms of the (T1, T2) grid of the reference workload, ms."""
    s = int(np.ceil(np.sqrt(n)))
    T1, T2 = np.meshgrid(np.geomspace(200, 3000, s), np.geomspace(10, 300, s), indexing="ij")
    return T1.ravel()[:n].copy(), T2.ravel()[:n].copy()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="blochsim",
        description="MR fingerprinting from dictionary to maps: an FISP MRF train (an ideal inversion, "
                    "TI, then TRs of pulse, sample and one shift, TR 10 ms, flips 5-60-2 degrees), its "
                    "dictionary over T1 x T2 x B1 (kept compressed), a numerical brain phantom's noisy "
                    "acquisition, T1, T2 and M0 maps by dictionary matching and by PERK (B1 known), their "
                    "errors against the truth, and maps.png (with matplotlib). With --dictionary-only: "
                    "the reference dictionary on a (T1, T2) grid, atoms per second, dictionary.npz.")
    p.add_argument("--dictionary-only", action="store_true",
                   help="only simulate the reference dictionary (--atoms, --chunk, --out, --plot)")
    p.add_argument("--size", type=int, default=96, help="phantom voxels along a side (default 96)")
    p.add_argument("--noise", type=float, default=0.005,
                   help="noise standard deviation per real and imaginary part, M0 = 1 units (default 0.005)")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise (default 0)")
    p.add_argument("--no-perk", action="store_true", help="maps by dictionary matching only")
    p.add_argument("--maps", default="maps.png", metavar="FILE.png",
                   help="truth, estimates and errors (default maps.png; '' for none; needs matplotlib)")
    p.add_argument("--save-dictionary", default=None, metavar="FILE.npz",
                   help="write the (compressed) dictionary, its grids and protocol to FILE.npz")
    p.add_argument("--atoms", type=int, default=100_000, help="--dictionary-only: atoms (default 100000)")
    p.add_argument("--trs", type=int, default=500, help="repetitions in the train (default 500)")
    p.add_argument("--tr", type=float, default=10.0, help="repetition time, ms (default 10)")
    p.add_argument("--ti", type=float, default=None,
                   help="inversion time, ms (default 20 for the maps, 0 for --dictionary-only)")
    p.add_argument("--states", type=int, default=32, help="EPG orders (default 32)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="backend (default: the GPU if usable, else the CPU)")
    p.add_argument("--threads", type=int, default=None, help="host threads (default: all CPUs)")
    p.add_argument("--chunk", type=int, default=20_000, help="--dictionary-only: atoms per call (default 20000)")
    p.add_argument("--out", default="dictionary.npz",
                   help="--dictionary-only: output .npz (default dictionary.npz; '' for none)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="--dictionary-only: draw a few fingerprints (needs matplotlib)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://host:8786; needs "
                        "blochsim[distributed])")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run on a local Dask cluster of N worker processes (needs blochsim[distributed])")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


#: PERK's training ranges in the main job (ms): every tissue of the phantom,
#: CSF included, drawn and regressed in their logarithms
PERK_RANGES = {"T1": (300.0, 5000.0), "T2": (30.0, 2500.0)}


def _device(args, info):
    device = args.device
    if device == "auto":
        device = "cuda" if info["cuda"]["available"] else "cpu"
    if device == "cuda" and not info["cuda"]["available"]:
        print(f"blochsim: --device cuda, but the CUDA backend cannot run: {info['cuda']['reason']}",
              file=sys.stderr)
        return None
    return device


def _where(device, args, info):
    if device == "auto":
        return "the cluster's workers (their GPUs where usable)"
    return (f"CPU ({info['cpu']['isa']}, {args.threads or info['cpu']['threads']} threads)"
            if device == "cpu" else "GPU")


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("atoms", "chunk", "trs", "states"):
        if getattr(args, name) < 1:
            print(f"blochsim: --{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if args.size < 8:
        print(f"blochsim: --size must be >= 8, got {args.size}", file=sys.stderr)
        return 2
    if not (np.isfinite(args.noise) and args.noise >= 0):
        print(f"blochsim: --noise must be >= 0, got {args.noise}", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"blochsim: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    if args.workers is not None and args.scheduler is not None:
        print("blochsim: give --scheduler or --workers, not both", file=sys.stderr)
        return 2
    info = _dispatch.backends()
    cluster = args.workers is not None or args.scheduler is not None
    if cluster and args.dictionary_only:
        print("blochsim: --scheduler and --workers run the main job; --dictionary-only runs in this process",
              file=sys.stderr)
        return 2
    # on a cluster the workers' GPUs count, not this machine's
    device = "auto" if cluster and args.device == "auto" else _device(args, info)
    if device is None:
        return 2
    if args.dictionary_only:
        return _dictionary_job(args, device, info)
    if cluster:
        return _on_cluster(args, device, info)
    return maps_job(args, device, info)[0]


def _on_cluster(args, device, info):
    """The main job on a Dask cluster: a local one of --workers processes,
    or the one whose scheduler is at --scheduler."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        print("blochsim: --scheduler and --workers need Dask: pip install 'blochsim[distributed]'", file=sys.stderr)
        return 2
    # the workers' CPUs are theirs: each task takes its worker's share
    args.threads = None
    if args.scheduler is not None:
        try:
            client = Client(args.scheduler, timeout=10)
        except (OSError, TimeoutError) as e:
            print(f"blochsim: no Dask scheduler answered at {args.scheduler}: {e}", file=sys.stderr)
            return 2
        with client:
            _report_cluster(client)
            return maps_job(args, device, info, client)[0]
    share = max(1, info["cpu"]["threads"] // args.workers)  # one task a worker, each its share of the CPUs
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                      env=_dispatch.thread_env(share)) as cluster, Client(cluster) as client:
        _report_cluster(client)
        return maps_job(args, device, info, client)[0]


def _report_cluster(client):
    info = client.scheduler_info()
    print(f"blochsim: Dask cluster at {info.get('address', '?')}, {len(info['workers'])} workers")


def maps_job(args, device, info, client=None):
    """The main job: dictionary, phantom, noisy acquisition, maps, errors,
    picture; on the cluster of a ``dask.distributed`` ``client`` when given
    (the same numbers).  Returns (exit status, {method: {parameter: median
    relative error}}) for the voxels inside the head."""
    from blochsim.estimators import PERK, DictionaryMatcher
    from blochsim.phantom import TISSUES, brain_phantom

    ti = 20.0 if args.ti is None else args.ti
    flips = reference_flips(args.trs)
    sim = MRFSimulator(flip=flips, TR=args.tr, TI=ti, states=args.states, device=device, threads=args.threads)
    # B1 in steps of 0.025: at long T2 (CSF) a B1 step trades against T2
    grids = dict(T1=np.geomspace(200.0, 5000.0, 80), T2=np.geomspace(10.0, 2500.0, 80),
                 B1=np.linspace(0.75, 1.25, 21))
    n_atoms = int(np.prod([len(g) for g in grids.values()]))
    print(f"blochsim: MR fingerprinting, {args.trs} TRs of {args.tr:g} ms after an inversion (TI {ti:g} ms), "
          f"{args.states} states, on {_where(device, args, info)}")
    steps = tqdm(total=4 if args.no_perk else 5, desc="blochsim", unit="step", disable=args.quiet,
                 file=sys.stderr)
    t_start = t0 = time.perf_counter()
    steps.set_postfix_str("dictionary")
    lazy = client is not None
    dm = DictionaryMatcher(sim).fit(dask=lazy, **grids)
    if lazy:
        _progress(args, dm._atoms, "dictionary")
    t_dict = time.perf_counter() - t0
    steps.update()
    ph = brain_phantom(args.size)
    mask = ph["mask"]
    steps.set_postfix_str("acquisition")
    t0 = time.perf_counter()
    tissue = {k: ph[k][mask] for k in ("T1", "T2", "M0", "B1")}
    signals = _acquire(args, sim, tissue, device, client)
    t_acq = time.perf_counter() - t0
    steps.update()
    steps.set_postfix_str("dictionary matching")
    t0 = time.perf_counter()
    m = dm.map(signals)
    if lazy:
        m = dict(zip(m, client.compute(_progress(args, list(m.values()), "matching"), sync=True)))
    m = {k: np.asarray(v) for k, v in m.items()}
    t_match = time.perf_counter() - t0
    estimates = {"dictionary": dict(T1=m["T1"], T2=m["T2"], M0=np.abs(m["M0"]))}
    steps.update()
    t_perk = None
    if not args.no_perk:
        steps.set_postfix_str("PERK")
        t0 = time.perf_counter()
        # T1 and T2 span a decade and more (white matter to CSF): drawn
        # uniformly in their logarithms, so that short and long ones are
        # trained alike; 3,000 features keep white matter's T2 within a few
        # per cent over the wider ranges
        perk = PERK(sim, n_features=3000).fit(noise_std=args.noise, known="B1", T1=PERK_RANGES["T1"],
                                              T2=PERK_RANGES["T2"], M0=(0.3, 1.2), B1=(0.75, 1.25),
                                              log=("T1", "T2"), dask=lazy)
        t_train = time.perf_counter() - t0
        t0 = time.perf_counter()
        p = perk.map(signals, known={"B1": ph["B1"][mask]})
        if lazy:
            p = dict(zip(p, client.compute(list(p.values()), sync=True)))
        p = {k: np.asarray(v) for k, v in p.items()}
        t_perk = (t_train, time.perf_counter() - t0)
        estimates["PERK"] = dict(T1=p["T1"], T2=p["T2"], M0=p["M0"])
        steps.update()
    steps.set_postfix_str("errors")
    errors = {}
    label = ph["label"][mask]
    print(f"blochsim: dictionary of {n_atoms:,} atoms (T1 x T2 x B1) in {t_dict:.1f} s, kept at rank "
          f"{dm.compressed_rank or args.trs} of {args.trs}; {mask.sum():,} voxels, noise {args.noise:g}")
    stages = [("dictionary", t_dict), ("acquisition", t_acq), ("dictionary matching", t_match)]
    if t_perk is not None:
        stages += [("PERK training", t_perk[0]), ("PERK map", t_perk[1])]
    print(f"{'stage':<24}{'seconds':>12}")
    for name, t in stages:
        print(f"  {name:<22}{t:>12.3f}")
    print(f"  {'total':<22}{time.perf_counter() - t_start:>12.3f}")
    header = f"{'median |error| / truth':<24}" + "".join(f"{k:>12}" for k in ("T1", "T2", "M0"))
    print(header)
    for method, est in estimates.items():
        errors[method] = {}
        for k in ("T1", "T2", "M0"):
            truth = ph[k][mask]
            errors[method][k] = float(np.median(np.abs(est[k] - truth) / truth))
        errors[method]["tissues"] = {}
        print(f"{method:<24}" + "".join(f"{100 * errors[method][k]:>11.2f}%" for k in ("T1", "T2", "M0")))
        for i, name in enumerate(TISSUES):
            inside = label == i + 1
            row = [np.median(np.abs(est[k][inside] - ph[k][mask][inside]) / ph[k][mask][inside])
                   for k in ("T1", "T2", "M0")]
            beyond = method == "PERK" and any(not lo <= TISSUES[name][k] <= hi for k, (lo, hi) in PERK_RANGES.items())
            errors[method]["tissues"][name] = dict(zip(("T1", "T2", "M0"), map(float, row)))
            print(f"  {name:<22}" + "".join(f"{100 * e:>11.2f}%" for e in row)
                  + ("  (beyond PERK's training ranges)" if beyond else ""))
    steps.update()
    steps.close()
    if args.save_dictionary:
        dm.save(args.save_dictionary)
        print(f"blochsim: wrote {args.save_dictionary}")
    if args.maps:
        plt = _pyplot()
        if plt is None:
            print("blochsim: maps.png needs matplotlib (pip install matplotlib); skipped", file=sys.stderr)
        else:
            _draw_maps(plt, args.maps, ph, mask, estimates)
            print(f"blochsim: wrote {args.maps}")
    return 0, errors


def _acquire(args, sim, tissue, device, client):
    """The phantom's noisy signals (voxels, TRs): simulated, then complex
    Gaussian noise of standard deviation ``args.noise`` a part from the
    core's counter-based generator (:mod:`blochsim._arrays.noise`), the same numbers
    on any device.  On the GPU they stay there (a DeviceArray); on a cluster
    they are a Dask array."""
    key = _noise.key(args.seed)
    n = len(tissue["T1"])
    if client is not None:
        import dask.array as da
        workers = max(1, len(client.scheduler_info()["workers"]))
        tissue = dict(tissue, T1=da.from_array(tissue["T1"], chunks=max(1024, -(-n // (4 * workers)))))
        clean = sim.simulate(**tissue)
        noise = np.zeros(clean.shape, np.complex64)
        _noise.add(noise, args.noise, key, 0, _noise.ACQUISITION, threads=_dispatch.call_threads(args.threads))
        return _progress(args, clean + noise, "acquisition")
    if device == "cuda":
        from blochsim._arrays.device import DeviceArray
        signals = DeviceArray((n, args.trs), np.complex64)
        sim.simulate(**{k: DeviceArray.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in tissue.items()},
                     out=signals)
    else:
        signals = np.array(sim.simulate(**tissue), np.complex64, order="C")
    return _noise.add(signals, args.noise, key, 0, _noise.ACQUISITION, threads=_dispatch.call_threads(args.threads))


def _progress(args, collection, what):
    """``collection`` (a Dask collection or a list of them) persisted on the
    cluster, with Dask's progress display unless --quiet."""
    import dask
    from distributed import progress
    persisted = dask.persist(*collection) if isinstance(collection, list) else dask.persist(collection)
    if not args.quiet:
        print(f"blochsim: {what}", file=sys.stderr)
        progress(*persisted)
        print(file=sys.stderr)
    return list(persisted) if isinstance(collection, list) else persisted[0]


def _draw_maps(plt, path, ph, mask, estimates):
    """Rows T1, T2, M0; columns truth, then each method's estimate and its
    relative error."""
    methods = list(estimates)
    cols = 1 + 2 * len(methods)
    fig, axes = plt.subplots(3, cols, figsize=(2.6 * cols, 7.6), squeeze=False)
    limits = {"T1": (0, 4500), "T2": (0, 300), "M0": (0, 1.1)}
    for r, k in enumerate(("T1", "T2", "M0")):
        panels = [("truth", ph[k], limits[k], "viridis")]
        for method in methods:
            img = np.zeros_like(ph[k])
            img[mask] = estimates[method][k]
            err = np.zeros_like(ph[k])
            err[mask] = np.abs(estimates[method][k] - ph[k][mask]) / ph[k][mask]
            panels += [(method, img, limits[k], "viridis"), (f"{method} |error|", err, (0, 0.2), "magma")]
        for c, (title, img, (lo, hi), cmap) in enumerate(panels):
            ax = axes[r, c]
            im = ax.imshow(np.where(mask, img, np.nan), vmin=lo, vmax=hi, cmap=cmap)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(title, fontsize=9)
            if c == 0:
                ax.set_ylabel(k + (" (ms)" if k != "M0" else ""))
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    fig.suptitle("blochsim: MR fingerprinting maps of a numerical phantom (error: |estimate - truth| / truth)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _dictionary_job(args, device, info) -> int:
    """The reference dictionary on a (T1, T2) grid, atoms per second."""
    ti = 0.0 if args.ti is None else args.ti
    flips = reference_flips(args.trs)
    T1, T2 = reference_tissues(args.atoms)
    sim = MRFSimulator(flip=flips, TR=args.tr, TI=ti, states=args.states, device=device,
                       threads=args.threads)
    print(f"blochsim: MRF dictionary, {args.atoms:,} atoms x {args.trs} TRs, {args.states} states, on "
          f"{_where(device, args, info)}")
    sim.simulate(T1=T1[:16], T2=T2[:16])  # warm-up: packs the stream once
    out = np.empty((args.atoms, args.trs), dtype=np.complex64)
    out.fill(0)  # touch the pages before timing, as a resident dictionary would be
    bar = tqdm(total=args.atoms, unit="atom", unit_scale=True, desc="blochsim",
               disable=args.quiet or args.atoms <= args.chunk, file=sys.stderr)
    t0 = time.perf_counter()
    for a in range(0, args.atoms, args.chunk):
        b = min(a + args.chunk, args.atoms)
        sim.simulate(T1=T1[a:b], T2=T2[a:b], out=out[a:b])
        bar.update(b - a)
    dt = time.perf_counter() - t0
    bar.close()
    print(f"blochsim: {dt:.3f} s, {args.atoms / dt:,.0f} atoms/s")
    if args.out:
        np.savez(args.out, signals=out, T1_ms=T1, T2_ms=T2, flip_deg=flips, TR_ms=args.tr, TI_ms=ti,
                 states=args.states)
        print(f"blochsim: wrote {args.out} (signals {out.shape} complex64, T1_ms, T2_ms, flip_deg)")
    if args.plot:
        plt = _pyplot()
        if plt is None:
            print("blochsim: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
        fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
        picks = np.unique(np.linspace(0, args.atoms - 1, min(5, args.atoms)).astype(int))
        for i in picks:
            ax[1].plot(out[i].real, label=f"T1 {T1[i]:.0f} ms, T2 {T2[i]:.0f} ms")
        ax[0].plot(flips, color="k")
        ax[0].set_ylabel("flip (deg)")
        ax[1].set_xlabel("TR index")
        ax[1].set_ylabel("signal (M0 = 1)")
        ax[1].legend(fontsize=8)
        fig.suptitle("blochsim: MR fingerprinting signal evolutions")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"blochsim: wrote {args.plot}")
    return 0
