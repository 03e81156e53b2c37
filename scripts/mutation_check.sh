#!/usr/bin/env bash
# Shows that the GPU tests can fail: for each, one small deliberate break in
# the code (or the kernel) under test, then that one test id, which must FAIL.
# Run on the GPU machine after scripts/gpu_check.sh (it uses the venv that
# built): bash scripts/mutation_check.sh   Logs go to $OUT/mutations when set.
# Each break is a sed on a file of this checkout, restored from a copy at once
# (and on exit): the venv's editable install reads these Python files and
# headers, so nothing is rebuilt. A line per break: PASS when the test failed,
# SURVIVED when it passed anyway, SKIPPED/ERROR when it did not run.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
venv="${JMF_VENV:-$repo/build/venv-gpu}"
out="${OUT:-$repo/build/gpu-logs}/mutations"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
backup="$(mktemp -d)"
restore() { [ -f "$backup/file" ] && cp "$backup/file" "$backup_target" && rm -f "$backup/file"; }
trap restore EXIT
passed=0; total=0; start=$SECONDS

mutate() {  # name file sed-expression test-id
  local name="$1" file="$2" expr="$3" test="$4"
  total=$((total + 1))
  backup_target="$file"; cp "$file" "$backup/file"
  sed -i "$expr" "$file"
  if cmp -s "$file" "$backup/file"; then
    restore; echo "ERROR    $name: the break did not apply to $file"; return
  fi
  local t=$SECONDS
  # A fresh kernel cache: a binary compiled before the break must not stand in for the broken code.
  JAX_MOSAIC_FFI_CACHE_DIR="$(mktemp -d)" \
    "$venv/bin/python" -P -m pytest -q -rs -x -p no:cacheprovider "$test" > "$out/$name.log" 2>&1
  local rc=$?
  restore
  if [ $rc -eq 1 ]; then
    passed=$((passed + 1)); echo "PASS     $name ($((SECONDS - t)) s): $test failed"
  elif [ $rc -eq 0 ] && grep -q "skipped" "$out/$name.log"; then
    echo "SKIPPED  $name: $test did not run ($(grep -m1 SKIPPED "$out/$name.log"))"
  elif [ $rc -eq 0 ]; then
    echo "SURVIVED $name: $test passed with the break"
  else
    echo "ERROR    $name: pytest exited $rc (see $out/$name.log)"
  fi
}

# Without the alias the kernel writes through in0 into the caller's arrays.
mutate aliasing jax_mosaic_ffi/call/lowering.py \
  's/operand_output_aliases=dict(spec.aliases) or None,/operand_output_aliases=None,/' \
  "tests/test_aliasing.py::test_an_optimizer_step_through_one_pointer_per_buffer[order0]"
# The demo stops early as if there were no GPU.
mutate demo examples/demo.py 's/gpus, error = jax.devices("cuda"), None/gpus, error = [], None/' \
  tests/test_examples.py::test_demo_runs
# The scratch is zeroed even when zero_scratch=False.
mutate zero-scratch jax_mosaic_ffi/call/launch_options.py 's/((n_out,) if self.zero_scratch else ())/((n_out,) if scratch else ())/' \
  tests/test_tma.py::test_scratch_is_zeroed_only_when_asked
# The collective kernels' exit barrier does nothing.
mutate barrier jax_mosaic_ffi/include/jax_mosaic_ffi/collective.cuh \
  's/^__device__ inline void exit_barrier(const CollectiveMetadata\* m) {/&\n  return;/' \
  "tests/test_collectives.py::test_one_device_clique_sees_its_rank_peers_and_barrier[False]"
mutate barrier-in-command-buffer jax_mosaic_ffi/include/jax_mosaic_ffi/collective.cuh \
  's/^__device__ inline void exit_barrier(const CollectiveMetadata\* m) {/&\n  return;/' \
  "tests/test_collectives.py::test_collective_kernels_chained_in_and_out_of_a_command_buffer[command-buffers]"
# PDL-safe entries no longer wait for the previous kernel (they still let the next one in).
mutate pdl-wait jax_mosaic_ffi/cuda/nvrtc/program.py \
  's|"\\n\\tgriddepcontrol.wait;  // jax_mosaic_ffi: PDL-safe entry"|"\\n\\t// no wait"|' \
  "tests/test_pdl.py::test_a_chain_of_pdl_launches_reads_only_finished_results[stream]"
# Kernels that manage PDL themselves get the wait added anyway: the negative control must notice it sees no race.
mutate pdl-negative-control jax_mosaic_ffi/cuda/nvrtc/program.py \
  's/  if "griddepcontrol" in ptx\[start:end\]:/  if False:/' \
  tests/test_pdl.py::test_the_chain_detects_the_race_when_a_kernel_does_not_wait
# A PTX module labelled for an arch the GPU cannot JIT.
mutate ptx jax_mosaic_ffi/cuda/kernel.py 's/  arch = Arch.parse(ptx_info.target_arch(text) or DEFAULT_ARCH.sm)/  arch = Arch.parse("sm_120")/' \
  "tests/test_kernel_formats.py::test_a_ptx_kernel_runs_and_matches_numpy[False]"
# A cubin labelled for another arch.
mutate cubin jax_mosaic_ffi/cuda/kernel.py 's/built.append(Image(ImageKind.CUBIN, Arch.parse(target), data))/built.append(Image(ImageKind.CUBIN, Arch.parse("sm_80"), data))/' \
  tests/test_kernel_formats.py::test_a_cubin_kernel_runs_and_matches_numpy
# The portable PTX is not kept.
mutate portable-ptx jax_mosaic_ffi/cuda/nvrtc/compiler.py 's/  images.append(Image(ImageKind.PTX, targets\[0\], result\["ptx"\]))/  pass/' \
  tests/test_kernel_formats.py::test_the_portable_form_runs_through_the_drivers_jit
# JAX_MOSAIC_FFI_RECORD=0 is ignored.
mutate record-off jax_mosaic_ffi/call/registration.py 's/    if os.environ.get(RECORD_ENV, "1") in ("0", "false", "off"):/    if False:/' \
  "tests/test_command_buffers.py::test_record_off_captures_stream_launches_with_the_same_results[command-buffers]"
# Decorated Triton kernels (@triton.autotune / @triton.heuristics): several configs launched untimed.
mutate triton-autotune-untimed jax_mosaic_ffi/triton/decorated.py \
  's/    if len(metas) == 1:  # heuristics only, or one config left: nothing to time/    if True:/' \
  tests/test_triton_decorators.py::test_tutorial_grouped_matmul_autotuned_with_strides_matches_numpy
# reset_to_zero no longer zeroes: the split-K atomics add into the poisoned output.
mutate triton-reset-to-zero jax_mosaic_ffi/triton/decorated.py 's/        zero.append(ref.index)/        pass/' \
  tests/test_triton_decorators.py::test_reset_to_zero_makes_the_atomic_split_k_matmul_right
# The in-place buffer loses its alias: the kernel writes the caller's input, the output stays poisoned.
mutate triton-restore-value jax_mosaic_ffi/triton/decorated.py \
  's/replace(self.launch, zero_outputs=zero_outputs, sharding=None)/replace(self.launch, zero_outputs=zero_outputs, sharding=None, input_output_aliases=None)/' \
  tests/test_triton_decorators.py::test_restore_value_timing_never_writes_the_callers_arrays
# Heuristics see each scalar halved: BLOCK = next_power_of_2(n_cols / 2) covers part of each row.
mutate triton-heuristics-args jax_mosaic_ffi/triton/decorated.py \
  's/        return np.asarray(values\[ref.index\]).item()/&  \/\/ 2/' \
  tests/test_triton_decorators.py::test_heuristics_softmax_matches_numpy
# early_config_prune ignored: the 300-element call times three configs instead of launching the one left.
mutate triton-prune jax_mosaic_ffi/triton/decorated.py \
  's/  if layer.early_config_prune is not None:/  if False:/' \
  tests/test_triton_decorators.py::test_heuristics_over_autotune_with_pruning_match_numpy
# Heuristics below @triton.autotune no longer see the config: the README's EVEN cannot read BLOCK.
mutate triton-heuristics-order jax_mosaic_ffi/triton/decorated.py \
  's/_heuristics(layer, args.named, meta, passed, where)/_heuristics(layer, args.named, self.base.meta, passed, where)/' \
  tests/test_triton_decorators.py::test_the_readme_example_runs
# Triton's descriptors encoded without the swizzle its metadata asks for: the dot reads its tiles scrambled.
mutate descriptor-swizzle jax_mosaic_ffi/triton/tensor_descriptor.py \
  's/swizzle=triton_descriptors.SWIZZLE_BYTES\[meta.swizzle\],/swizzle=None,/' \
  tests/test_triton_descriptors.py::test_matmul_through_descriptors_matches_numpy
# The decomposed form's row strides (the ones the kernel reads) passed as 0: every row is row 0.
mutate descriptor-decomposed jax_mosaic_ffi/triton/tensor_descriptor.py \
  's/      for v in b.shape + b.strides:/      for v in b.shape + (0,) * (len(b.strides) - 1) + b.strides[-1:]:/' \
  tests/test_triton_descriptors.py::test_the_decomposed_form_runs
# NVSHMEM (one PE): the buffers are not staged through the symmetric heap, so the puts miss them.
mutate nvshmem-symmetric jax_mosaic_ffi/call/launch_spec.py \
  's/attributes\["nvshmem_symmetric"\] = ",".join("1" if s else "0" for s in symmetric)/attributes["nvshmem_symmetric"] = ",".join("0" for s in symmetric)/' \
  tests/test_nvshmem.py::test_one_pe_puts_to_itself
# NVSHMEM is started as PE 1 of 1.
mutate nvshmem-start jax_mosaic_ffi/call/peers/nvshmem.py 's/core.nvshmem_start(library, unique_id, pe, npes, device)/core.nvshmem_start(library, unique_id, pe + 1, npes, device)/' \
  tests/test_nvshmem.py::test_one_pe_barrier_and_signal_wait
# The NVSHMEM all-reduce adds one to its first peer's values.
mutate nvshmem-all-reduce jax_mosaic_ffi/ops/collectives.py 's/      out\[i\] = pe == 0 ? value : out\[i\] + value;/      out[i] = pe == 0 ? value + (T)1 : out[i] + value;/' \
  tests/test_nvshmem.py::test_the_nvshmem_all_reduce_of_one_pe_is_its_input
# Importing the package no longer hands the runtime NVSHMEM's starter: an exported call cannot start it.
mutate nvshmem-starter jax_mosaic_ffi/call/lowering.py 's/^nvshmem.install()$/pass/' \
  tests/test_nvshmem.py::test_an_exported_nvshmem_call_starts_nvshmem_in_a_fresh_process
# Symbolic launches lose their launch programs: the placeholders (grid 1, n = 0) launch, on the stream and in a graph.
mutate launch-programs jax_mosaic_ffi/call/launch_options.py 's/    return placeholders, tuple(code)/    return placeholders, ()/' \
  tests/test_symbolic_shapes.py::test_a_deserialized_symbolic_export_computes_its_grid_and_scalar_at_each_size
mutate launch-programs-in-command-buffer jax_mosaic_ffi/call/launch_options.py \
  's/    return placeholders, tuple(code)/    return placeholders, ()/' \
  "tests/test_symbolic_shapes.py::test_launch_programs_inside_command_buffers_and_out[command-buffers]"
echo "== $passed of $total breaks made their test fail, in $((SECONDS - start)) s"
[ "$passed" -eq "$total" ]
