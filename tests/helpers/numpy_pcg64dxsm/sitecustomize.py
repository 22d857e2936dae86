"""A node whose numpy draws other streams from `default_rng`: every Python process
started with this folder on PYTHONPATH (the agent, its children and their DataLoader
workers) gets a numpy whose `default_rng` builds its Generator on PCG64DXSM, the bit
generator numpy's documentation names as the likely next default, instead of PCG64, and
whose version says so. It stands for another numpy release that changes a generator:
the legacy `numpy.random` functions (frozen by NEP 19) are untouched."""

import numpy
import numpy.random

numpy.__version__ = f"{numpy.__version__}+pcg64dxsm"


def default_rng(seed=None):
    if isinstance(seed, numpy.random.Generator):
        return seed
    return numpy.random.Generator(numpy.random.PCG64DXSM(seed))


numpy.random.default_rng = default_rng
