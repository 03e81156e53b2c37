"""The Python side of csrc/peers/: what a collective kernel's peers in other processes trade before it runs.

cross_process.py  the symmetric workspace's exchange between processes (IPC handles, host flag pages)
nvshmem.py        NVSHMEM's job: who the PEs are, its bootstrap, its start and end
kv_store.py       what both do with jax.distributed's key-value store: keys set once, one verdict per attempt

Imports only from `base`, and nothing of the rest of `call` (which calls into it).
"""
