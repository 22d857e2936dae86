"""Reads that several domains need, owned here instead of by one of them.

A domain's own queries stay in its ``repository``; what two domains read the same way
(the fingerprints the analysis compares, the results of a list of runs, manifests by
hash) lives here once, so no domain imports another's service or repository.
"""
