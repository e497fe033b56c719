"""Dictionary matching: the estimator (:mod:`.matcher`), its Dask half
(:mod:`.lazy`, imported only for Dask inputs, ``dask=True`` or a store) and
the kernels both share (:mod:`._atoms`)."""
from blochsim.estimators.dictionary.matcher import DictionaryMatcher

__all__ = ["DictionaryMatcher"]
