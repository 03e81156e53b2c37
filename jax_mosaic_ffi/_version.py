# The one place the version is set: pyproject.toml reads it at build time
# (scikit-build-core's regex provider) and jax_mosaic_ffi.__version__ imports it.
__version__ = "0.1.0"
