"""The route from a public method to a kernel (imports nothing, so that its
modules import alone).

A public method builds one :class:`Request` (operation, protocol streams,
tissue, where the data lives, derivatives, output) and hands it to
:func:`run`, which picks the entry of the table (:mod:`.table`) for its
operation, residence and kind.  The backends: host lanes (:mod:`.host`),
the device (:mod:`.device`), NumPy through the device in chunks
(:mod:`.streaming`), the pooled kernels (:mod:`.pooled`); beside them where
a call runs (:mod:`.dispatch`), the memory refusals (:mod:`.memory`), pool
bookkeeping (:mod:`.pools`) and reverse-mode assembly (:mod:`.reverse`).
"""
