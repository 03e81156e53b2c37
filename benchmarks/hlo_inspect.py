"""Reading the custom calls out of a lowered program: what the tests check and the lowering benchmark reports.

jax is imported inside the functions (benchmarks/__init__.py says why).
"""


def _value(attr):
  from jax._src.lib.mlir import ir
  for kind, read in ((ir.BoolAttr, lambda a: a.value), (ir.IntegerAttr, lambda a: a.value),
                     (ir.StringAttr, lambda a: a.value_bytes),
                     (ir.DenseI32ArrayAttr, lambda a: list(a)), (ir.DenseI64ArrayAttr, lambda a: list(a))):
    if isinstance(attr, kind):
      return read(attr)
  return attr


def _layouts(attrs, name: str):
  from jax._src.lib.mlir import ir
  if name not in attrs:
    return None
  return [[int(v) for v in ir.DenseIntElementsAttr(layout)] for layout in ir.ArrayAttr(attrs[name])]


def custom_calls(lowered) -> list[dict]:
  """Each stablehlo.custom_call of a lowered function: its target, attributes, config and the layouts (XLA's
  minor-to-major) it asks of its operands and results."""
  from jax._src.lib.mlir import ir
  module = lowered.compiler_ir("stablehlo")
  found = []

  def walk(operation):
    for region in operation.regions:
      for block in region.blocks:
        for op in block.operations:
          if op.operation.name == "stablehlo.custom_call":
            attrs = op.operation.attributes
            # jax's own calls (a symbolic shape's shape_assertion) carry no backend_config.
            config = ir.DictAttr(attrs["mhlo.backend_config"]) if "mhlo.backend_config" in attrs else []
            found.append({
                "target": ir.StringAttr(attrs["call_target_name"]).value,
                "api_version": ir.IntegerAttr(attrs["api_version"]).value if "api_version" in attrs else 1,
                "attributes": {name: attrs[name] for name in attrs},
                "config": {config[i].name: _value(config[i].attr) for i in range(len(config))},
                "operand_layouts": _layouts(attrs, "operand_layouts"),
                "result_layouts": _layouts(attrs, "result_layouts"),
                "operands": len(op.operation.operands),
                "results": len(op.operation.results),
            })
          walk(op.operation)

  walk(module.operation)
  return found
