"""Checks the nodes of this library's ops in an ONNX model against the catalogue, exactly.

The kernels validate their attributes when onnxruntime creates them, but onnxruntime's C API
lets a kernel ask only for an attribute it names: it cannot list a node's attributes. So a
kernel rejects a wrong type or value of every attribute it knows, and an unknown name only
when that name is close to a known one (a typo of one character dropped, doubled or swapped,
other case or separators). This check reads the model itself and so sees every attribute:
an unknown name, a wrong type or a value out of range, in the main graph and every subgraph.

    python -m ort_mx_ops.model_check model.onnx      # exit 0: all good; 2: one line per problem
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence, Union

import onnx
from onnx import AttributeProto, helper

from .formats import OPS, PRODUCT_DOMAIN, AttrSpec, resolve_attrs
from .graph_walk import all_nodes

__all__ = ["check_model", "model_problems"]

_ONNX_TYPES = {"int": AttributeProto.INT, "string": AttributeProto.STRING,
               "ints": AttributeProto.INTS}

# The packed-weight decoders (docs/packed_weights.md) take the attributes of the block op of
# their family, without rounding_mode, plus the output shape; convert_to_bfloat_before_bfp
# may only be 0 (it acted when the weight was folded).
_PACKED = {"MXDequantize": "MXQuantizeDequantize", "BFPDequantize": "BFPQuantizeDequantize"}
_PACKED_UNUSED = {"rounding_mode", "use_compiler_version_cpu_kernel", "nchwc_block",
                  "nchwc_channels", "input_divisor", "input_hardswish"}
_PACKED_ONLY = {a.name: a for a in (AttrSpec("shape", "ints", None),
                                    AttrSpec("convert_to_bfloat_before_bfp", "int", 0, 0, 0))}


def _schema(node: onnx.NodeProto) -> Optional[tuple[str, dict[str, AttrSpec]]]:
    """(catalogue op, attributes by name) of a node of ours, or None for any other node."""
    if node.domain == PRODUCT_DOMAIN and node.op_type in _PACKED:
        op = _PACKED[node.op_type]
        attrs = {a.name: a for a in OPS[op].attrs if a.name not in _PACKED_UNUSED}
        attrs.update((n, a) for n, a in _PACKED_ONLY.items() if n == "shape" or n in attrs)
        return op, attrs
    schema = OPS.get(node.op_type)
    if schema is None or schema.domain != node.domain:
        return None
    return node.op_type, {a.name: a for a in schema.attrs}


def _type_name(attr: AttributeProto) -> str:
    return AttributeProto.AttributeType.Name(attr.type).lower()


def model_problems(model: onnx.ModelProto) -> tuple[int, list[str]]:
    """(number of nodes of this library's ops, one message per problem found in them)."""
    checked, problems = 0, []
    for node in all_nodes(model.graph):
        found = _schema(node)
        if found is None:
            continue
        checked += 1
        op, specs = found
        where = f"{node.op_type} node {node.name or '(unnamed)'!r}"
        values, bad = {}, False
        for attr in node.attribute:
            spec = specs.get(attr.name)
            if spec is None:
                problems.append(f"{where}: unknown attribute {attr.name!r}; allowed: "
                                f"{', '.join(sorted(specs))}")
                bad = True
            elif attr.type != _ONNX_TYPES[spec.type]:
                problems.append(f"{where}: attribute {attr.name!r} is {_type_name(attr)}, "
                                f"expected {spec.type}")
                bad = True
            else:
                value = helper.get_attribute_value(attr)
                values[attr.name] = value.decode() if isinstance(value, bytes) else value
        if "shape" in specs and all(a.name != "shape" for a in node.attribute):
            problems.append(f"{where}: attribute 'shape' (ints, the output's shape) is required")
            bad = True
        if bad:
            continue
        shape = values.pop("shape", None)
        if shape is not None and any(d < 0 for d in shape):
            problems.append(f"{where}: attribute 'shape' has a negative dimension")
        try:
            for name, value in values.items():  # the packed ops' narrower ranges
                if specs[name] is _PACKED_ONLY.get(name):
                    specs[name].check(op, value)
            resolve_attrs(op, values)
        except ValueError as exc:
            problems.append(f"{where}: {str(exc).split(': ', 1)[-1]}")
    return checked, problems


def check_model(model: Union[str, os.PathLike, onnx.ModelProto]) -> int:
    """Checks every node of this library's ops in ``model`` (a path or a ModelProto; external
    data is not loaded) and returns how many there are. Raises ``ValueError`` listing every
    problem, one per line: the node, the attribute, what was found and what is allowed."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model), load_external_data=False)
    checked, problems = model_problems(model)
    if problems:
        raise ValueError("\n".join(problems))
    return checked


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m ort_mx_ops.model_check MODEL...``: 0 when every model is clean, else 2."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m ort_mx_ops.model_check",
                                description="Check the attributes of this library's ops in "
                                            "ONNX models (names, types, values).")
    p.add_argument("models", nargs="+", metavar="MODEL")
    args = p.parse_args(argv)
    status = 0
    for path in args.models:
        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is one line, exit 2
            print(f"{path}: cannot read the model: {exc}", file=sys.stderr)
            status = 2
            continue
        checked, problems = model_problems(model)
        for line in problems:
            print(f"{path}: {line}", file=sys.stderr)
        if problems:
            status = 2
        else:
            print(f"{path}: {checked} node(s) of ort-mx-ops checked, no problem")
    return status


if __name__ == "__main__":
    sys.exit(main())
