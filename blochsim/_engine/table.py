"""The route of every call: one table from (operation, residence, kind) to
the entry that runs it.

- residence (:attr:`Request.residence`): "host", "through" (NumPy inputs
  on the card, in chunks under the budget) or "device" (device arrays);
- kind: "single" (one pool on one EPG order), "pooled" (pools or exact
  rectangular pulses: the pooled kernels) or "keyed" (a stream of 3-D
  moments: the moment-keyed EPG).

Each entry checks memory, builds the planes and calls one backend
(:mod:`.host`, :mod:`.device`, :mod:`.pooled`); what an entry cannot
compute is refused by name before any kernel runs.
"""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim._arrays.device import device_inputs, device_results, from_host, gradients_in_libraries, to_host
from blochsim._engine import device, host, pooled, reverse, streaming
from blochsim._engine.request import Request


def run(req: Request):
    """The result of a public method's call: (kind, entry) from the table."""
    kind, req, extra = _kind(req)
    return TABLE[(req.op, req.residence, kind)](req, extra)


def _kind(req):
    """(kind, the request with its idle pools dropped, the pooled
    configuration or None)."""
    stream = req.traced[0] if req.traced is not None else None
    if req.op == "vjp" and stream.moments is not None:
        return "keyed", req, None
    if req.op == "jacobian_vjp":
        return "single", req, None
    tissue, pools = req.streams.pooled(req.tissue, req.names if req.op != "simulate" else (), stream,
                                       keyed=req.op != "vjp")
    req = req._replace(tissue=tissue)
    if pools is not None:
        return "pooled", req, pools
    s = req.streams.packed() if stream is None else stream
    return ("keyed" if s.moments is not None else "single"), req, None


# -- simulate ----------------------------------------------------------------

def _simulate_host(req, _):
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, states, _ = req.streams.stream(set(arrays), keyed=True)
    s, ps = req.streams.host_stream(set(arrays), s, ps, states, arrays, shape)
    if s.moments is not None:
        return host.keyed_forward(req.owner, s, ps, arrays, shape, req.out, req.route.threads)
    return host.forward(req.owner, ps, arrays, shape, req.out, req.route.threads, req.streams.variant)


def _simulate_through(req, _):
    arrays, shape = req.streams.tissue(req.tissue)
    _, ps, _, _ = req.streams.stream(set(arrays))
    return host.forward(req.owner, ps, arrays, shape, req.out, req.route.threads, req.streams.variant,
                        streamed=req.streams.budget or 0)


def _simulate_device(req, _):
    _, ifaces, arrays, shape = device_inputs(req.tissue, req.route.on_device)
    s, ps, _, _ = req.streams.stream(set(req.tissue), keyed=True)
    return device.resident(req.owner, ps, arrays, ifaces, shape, shape + (ps.n_samples,), req.out,
                           keyed=s if s.moments is not None else None)


def _simulate_keyed_host(req, _):
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), keyed=True)
    return host.keyed_forward(req.owner, s, ps, arrays, shape, req.out, req.route.threads)


def _simulate_keyed_through(req, _):
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), keyed=True)
    return streaming.keyed_forward(req.owner, s, ps, arrays, shape, req.out, req.streams.budget)


def _pooled_play(req, pools):
    config, s, ps = pools
    names = req.names if req.op == "jacobian" else ()
    signal, J = pooled.play(req.streams.name, ps, req.streams.lineshape, req.tissue, config, req.route, names,
                            req.out, req.streams.variant, keyed=s, one=req.one, budget=req.streams.budget)
    if req.op == "simulate":
        return signal
    if req.out is not None:
        return req.out
    # (device results come back shaped)
    return signal, (J[..., 0, :] if req.one and isinstance(J, np.ndarray) else J)


# -- jacobian ----------------------------------------------------------------

def _jacobian_host(req, _):
    fields, scale = reverse.fields_and_scale(req.names)
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, states, _ = req.streams.stream(set(arrays), keyed=True)
    s, ps = req.streams.host_stream(set(arrays), s, ps, states, arrays, shape)
    if s.moments is not None:
        return host.keyed_jacobian(req.owner, s, ps, arrays, shape, fields, scale, req.one, req.route.threads,
                                   req.out)
    result, _ = host.jacobian(req.owner, ps, arrays, shape, fields, scale, req.one, req.route.threads,
                              req.streams.variant, req.out)
    return result


def _jacobian_device(req, _):
    fields, scale = reverse.fields_and_scale(req.names)
    intake = device_inputs(req.tissue, req.route.on_device)
    _, ps, _, _ = req.streams.stream(set(req.tissue))
    return device.jacobian(req.owner, ps, intake, req.names, fields, scale, req.one, req.out)


def _jacobian_through(req, _):
    fields, scale = reverse.fields_and_scale(req.names)
    arrays, shape = req.streams.tissue(req.tissue)
    _, ps, _, _ = req.streams.stream(set(arrays))
    return streaming.jacobian(req.owner, ps, arrays, shape, fields, scale, req.one, req.out, req.streams.budget)


def keyed_jacobian_on_host(req):
    """The signal and Jacobian (*voxels, len(names), samples) of a stream of
    3-D moments on the host's moment-keyed EPG (its Jacobian is not played
    on the card), pools included, device arrays copied through the host;
    with the library of the device inputs (None without one)."""
    owner = f"{req.streams.name}.jacobian"
    tissue, library = pooled.stage(req.route, req.tissue)
    on_host = req.route._replace(device="cpu", on_device=[])
    tissue, pools = req.streams.pooled(tissue, req.names, keyed=True)
    if pools is not None:
        config, s, ps = pools
        signal, J = pooled.play(req.streams.name, ps, req.streams.lineshape, tissue, config, on_host, req.names,
                                None, req.streams.variant, keyed=s)
        return signal, J, library
    fields, scale = reverse.fields_and_scale(req.names)
    arrays, shape = req.streams.tissue(tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), keyed=True)
    signal, J = host.keyed_jacobian(owner, s, ps, arrays, shape, fields, scale, False, req.route.threads)
    return signal, J, library


def _jacobian_keyed_elsewhere(req, _):
    """A keyed Jacobian the card was asked for: played on the host, results
    in the inputs' library (NumPy in, NumPy out)."""
    signal, J, library = keyed_jacobian_on_host(req)
    one = J[..., 0, :] if req.one else J
    if library is None and "out" not in req.route.on_device:
        if req.out is None:
            return signal, one
        for name, a, want in zip(("out[0]", "out[1]"), req.out, (signal.shape, one.shape)):
            V.check_host_out(name, a, want)
        req.out[0][...] = signal
        req.out[1][...] = one
        return req.out
    return device_results(signal, J, req.out, library or "numpy", req.one)


def _jacobian_keyed_host(req, _):
    fields, scale = reverse.fields_and_scale(req.names)
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), keyed=True)
    return host.keyed_jacobian(req.owner, s, ps, arrays, shape, fields, scale, req.one, req.route.threads, req.out)


def _jacobian_pooled(req, pools):
    return _pooled_play(req, pools)


# -- vjp ---------------------------------------------------------------------

def _vjp_host(req, _):
    stream, prov, pshapes = req.traced
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), stream)
    return host.vjp(req.owner, s, ps, arrays, shape, req.wrt, req.names, req.streams.p, prov, pshapes,
                    req.route.threads, req.streams.variant)


def _vjp_device(req, _):
    stream, prov, pshapes = req.traced
    intake = device_inputs(req.tissue, req.route.on_device)
    s, ps, _, _ = req.streams.stream(set(req.tissue), stream)
    fields, scale = reverse.fields_and_scale(req.names)
    return device.vjp(req.owner, s, ps, intake, req.wrt, req.names, fields, scale, req.streams.p, prov, pshapes)


def _vjp_through(req, _):
    stream, prov, pshapes = req.traced
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), stream)
    return streaming.vjp(req.owner, s, ps, arrays, shape, req.wrt, req.names, req.streams.p, prov, pshapes,
                         req.streams.budget)


def _vjp_keyed(req, _):
    """vjp of a stream of 3-D moments: the pullback of the moment-keyed
    Jacobian (forward mode along the tissue names, exact), on the host;
    the keyed maps are not differentiated with respect to protocol
    parameters."""
    if req.protocol_names:
        raise TypeError(f"{req.owner}: this sequence's gradient moments need the moment-keyed EPG, whose vjp "
                        f"reaches tissue properties only, not the protocol parameters "
                        f"{list(req.protocol_names)} (read the file with axis= and unit= to put its moments on "
                        "one EPG order)")
    libraries = pooled.device_libraries(req.route, req.tissue)
    staged, library = pooled.stage(req.route, req.tissue)
    tshapes = {k: np.shape(staged[k]) for k in req.names}
    signal, J, _ = keyed_jacobian_on_host(req._replace(tissue=staged, route=req.route._replace(on_device=[])))

    def pullback(cotangent):
        if library is not None and not isinstance(cotangent, np.ndarray):
            cotangent = to_host("cotangent", cotangent, allow_complex64=True)
        cot = reverse.cotangent(cotangent, signal.shape, dtype=np.complex128)
        # dL/dθ = Σ_samples Re(conj(cot) ∂s/∂θ) (cot = dL/dRe s + i dL/dIm s)
        return gradients_in_libraries(
            {k: reverse.reduce_to(np.sum((np.conj(cot) * J[..., j, :]).real, axis=-1), tshapes[k])
             for j, k in enumerate(req.names)}, libraries)

    return (signal if library is None else from_host(signal, library)), pullback


def _vjp_pooled(req, pools):
    config, s, ps = pools
    _, prov, pshapes = req.traced
    return pooled.vjp(req.streams.name, s, ps, req.streams.lineshape, req.tissue, config, req.route, req.wrt,
                      req.names, req.streams.p, prov, pshapes, req.streams.variant, req.streams.budget)


# -- jacobian_vjp ------------------------------------------------------------

def _jacobian_vjp_host(req, _):
    stream, prov, pshapes = req.traced
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), stream)
    return host.jacobian_vjp(req.owner, s, ps, arrays, shape, req.names, req.one, req.wrt, req.streams.p, prov,
                             pshapes, req.route.threads, req.streams.variant)


def _jacobian_vjp_device(req, _):
    stream, prov, pshapes = req.traced
    intake = device_inputs(req.tissue, req.route.on_device)
    s, ps, _, _ = req.streams.stream(set(req.tissue), stream)
    return device.jacobian_vjp(req.owner, s, ps, intake, req.names, req.one, req.wrt, req.streams.p, prov, pshapes)


def _jacobian_vjp_through(req, _):
    stream, prov, pshapes = req.traced
    arrays, shape = req.streams.tissue(req.tissue)
    s, ps, _, _ = req.streams.stream(set(arrays), stream)
    return streaming.jacobian_vjp(req.owner, s, ps, arrays, shape, req.names, req.one, req.wrt, req.streams.p, prov,
                                  pshapes, req.streams.budget)


TABLE = {
    ("simulate", "host", "single"): _simulate_host,
    ("simulate", "through", "single"): _simulate_through,
    ("simulate", "device", "single"): _simulate_device,
    ("simulate", "host", "keyed"): _simulate_keyed_host,
    ("simulate", "through", "keyed"): _simulate_keyed_through,
    ("simulate", "device", "keyed"): _simulate_device,
    ("jacobian", "host", "single"): _jacobian_host,
    ("jacobian", "through", "single"): _jacobian_through,
    ("jacobian", "device", "single"): _jacobian_device,
    ("jacobian", "host", "keyed"): _jacobian_keyed_host,
    ("jacobian", "through", "keyed"): _jacobian_keyed_elsewhere,
    ("jacobian", "device", "keyed"): _jacobian_keyed_elsewhere,
    ("vjp", "host", "single"): _vjp_host,
    ("vjp", "through", "single"): _vjp_through,
    ("vjp", "device", "single"): _vjp_device,
    ("jacobian_vjp", "host", "single"): _jacobian_vjp_host,
    ("jacobian_vjp", "through", "single"): _jacobian_vjp_through,
    ("jacobian_vjp", "device", "single"): _jacobian_vjp_device,
}
for _residence in ("host", "through", "device"):
    TABLE[("simulate", _residence, "pooled")] = _pooled_play
    TABLE[("jacobian", _residence, "pooled")] = _jacobian_pooled
    TABLE[("vjp", _residence, "keyed")] = _vjp_keyed
    TABLE[("vjp", _residence, "pooled")] = _vjp_pooled
