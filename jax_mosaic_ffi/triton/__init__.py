"""The Triton wing: everything that imports Triton, between the transforms and the public API."""
