"""The Triton front end: everything that imports Triton, as one layer above the transformations (layers: api ->
triton -> transforms -> call -> toolchain -> base; docs/architecture.md).

    kernel.py             triton_kernel, TritonFunction: a @triton.jit function with its constexprs and options
    options.py            TritonOptions: num_warps, num_stages, num_ctas, maxnreg, as one frozen object
    compile.py            the compile (TritonKernel, TritonInfo) through the one compile cache
    specialize.py         a call's specialization, decided by Triton's own launcher code
    descriptors.py        Triton's calling convention for host tensor descriptors
    decorators.py         @triton.autotune / @triton.heuristics read into data
    launch.py             a Triton kernel's launch from its metadata, handed to the call layer resolved
    decorated.py          a decorated kernel's launch: the decorators applied per traced call
    tensor_descriptor.py  jmf.TensorDescriptor: a call's operands as host tensor descriptors
"""
