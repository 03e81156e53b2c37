"""The environment an autotuning timing is valid for (store/tuning_records.py's `Environment`), read off a jax
device: its GPU's name and compute capability, the CUDA driver, this package's release and every installed front
end's toolchains (call/front_end.py's ``toolchains``), which the store, below the front ends, cannot read itself."""

from __future__ import annotations

from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.call import front_end
from jax_mosaic_ffi.store import tuning_records
from jax_mosaic_ffi.store.tuning_records import Environment


def toolchains() -> str:
  """The installed front ends' toolchains and their releases, as one text (each front end reads its own once)."""
  releases = {name: release for end in front_end.installed() for name, release in end.toolchains().items()}
  return ", ".join(f"{name} {releases[name]}" for name in sorted(releases))


def environment(device) -> Environment:
  """The environment of a jax device: a GPU's name and compute capability, or the CPU's kind."""
  capability = "none"
  if device.platform in ("gpu", "cuda"):
    ordinal = getattr(device, "local_hardware_id", None)
    ordinal = device.id if ordinal is None else ordinal
    for gpu in gpu_info.visible_gpus():
      if gpu.ordinal == ordinal:
        capability = f"{gpu.arch // 10}.{gpu.arch % 10}"
  return Environment(device=str(getattr(device, "device_kind", device.platform)), compute_capability=capability,
                     driver=gpu_info.driver_version(), jax_mosaic_ffi=tuning_records.package_version(),
                     toolchains=toolchains())
