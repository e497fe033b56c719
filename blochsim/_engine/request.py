"""One call of a public method, as the engine routes it."""
from __future__ import annotations

from typing import NamedTuple

#: the operations of a played simulator
OPERATIONS = ("simulate", "jacobian", "vjp", "jacobian_vjp")


class Request(NamedTuple):
    """What a public method asks of the engine.

    The engine reads the protocol only through ``streams``
    (:class:`blochsim._protocol.Streams`), never the simulator itself.
    """

    #: one of OPERATIONS
    op: str
    #: the protocol's event streams (blochsim._protocol.Streams)
    streams: object
    #: tissue values by public name: host values, or device arrays
    tissue: dict
    #: where the call runs (blochsim._engine.dispatch.Route)
    route: object
    #: tissue properties of the derivatives: jacobian and jacobian_vjp's
    #: directions, vjp's tissue names
    names: tuple = ()
    #: a single direction given as a str: J without its direction axis
    one: bool = False
    #: the caller's output: an array (simulate), a pair (jacobian) or None
    out: object = None
    #: reverse mode: every name of ``wrt``, and the protocol parameters among them
    wrt: tuple = ()
    protocol_names: tuple = ()
    #: reverse mode: (event stream, provenance of the traced values, their shapes)
    traced: tuple | None = None

    @property
    def owner(self) -> str:
        """The call's name in refusals: ``FSESimulator.simulate``."""
        return f"{self.streams.name}.{self.op}"

    @property
    def residence(self) -> str:
        """Where the data lives and runs: "host" (NumPy on the CPU),
        "through" (NumPy moved through the card under the budget) or
        "device" (device arrays on the card)."""
        if self.route.device != "cuda":
            return "host"
        return "device" if self.route.on_device else "through"
