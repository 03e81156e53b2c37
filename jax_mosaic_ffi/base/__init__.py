"""The base layer: what every other layer stands on (errors, switches, the C++ extension, the caches' storage).

It imports nothing of this package above it; `native` is the one importer of the C++ extension.
"""
