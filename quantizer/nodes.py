"""The node factory: the ONNX nodes (and initializers) that quantize one tensor in one format.

Every node the quantizer inserts comes from :meth:`NodeFactory.quantize`: a block format is
one ``BFPQuantizeDequantize`` / ``MXQuantizeDequantize`` node (legacy names on request),
wrapped in a Reshape pair when a weight is blocked over its flattened kernel window; BF16 is
the ``ExtendedQuantizeLinear`` -> ``ExtendedDequantizeLinear`` pair, ``Cast(BFLOAT16) ->
Cast(float)`` with ``bf16_cast``, or our one-node ``BF16QuantizeDequantize`` (the pair's
bits in one pass) with ``bf16_fused``, each with an optional rescale.  Op names, domains
and attributes come from the catalogue (:mod:`ort_mx_ops.formats`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ort_mx_ops.formats import FormatSpec, OPS, block_op

__all__ = ["Emitted", "NodeFactory"]


@dataclass
class Emitted:
    """What quantizing one tensor adds to a graph: nodes in execution order, the new
    initializers they read, and the op domains they need imported."""
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    domains: set[str] = field(default_factory=set)


class NodeFactory:
    """Builds quantize-dequantize nodes for one graph.  ``new_name(base)`` returns a tensor or
    node name unused in that graph.  The BF16 scale and zero-point initializers
    (scale 1, zero point 0) are created once per factory and shared."""

    def __init__(self, new_name: Callable[[str], str], legacy_names: bool = False,
                 bf16_cast: bool = False, bf16_fused: bool = False) -> None:
        if bf16_cast and bf16_fused:
            raise ValueError("bf16_cast and bf16_fused are two forms of BF16: choose one")
        self.new_name = new_name
        self.legacy_names = legacy_names
        self.bf16_cast = bf16_cast
        self.bf16_fused = bf16_fused
        self._unit_params: Optional[tuple[str, str]] = None

    def quantize(self, spec: FormatSpec, tensor: str, output: str, axis: Optional[int] = None,
                 *, bf16_scale: float = 1.0, elem_type: Optional[int] = None,
                 flat_shape: Optional[Sequence[int]] = None) -> Emitted:
        """Nodes reading ``tensor`` and writing ``output``: ``spec`` along ``axis`` (block
        formats; ``flat_shape``: the tensor's shape, to block it viewed as (shape[0], -1)
        along axis 1), or BF16 with ``bf16_scale`` (the tensor is divided by it before the
        rounding and multiplied back after) for a tensor of ``elem_type``."""
        out = Emitted()
        if spec.op == "BF16":
            if self.bf16_cast:
                self._bf16_cast_pair(out, tensor, output, bf16_scale, elem_type)
            elif self.bf16_fused:
                self._fused_bf16(out, tensor, output, bf16_scale)
            else:
                self._extended_pair(out, tensor, output, bf16_scale)
        else:
            self._block_node(out, spec, tensor, output, int(axis or 0), flat_shape)
        return out

    # -- block formats ---------------------------------------------------------------------
    def _block_node(self, out: Emitted, spec: FormatSpec, t: str, output: str, axis: int,
                    flat_shape: Optional[Sequence[int]]) -> None:
        op_type, domain = block_op(spec.op, self.legacy_names)
        src, dst = t, output
        if flat_shape is not None:
            # Block over each output channel's kernel window: (C, k...) -> (C, prod k).
            flat = self._const(f"{t}_flat_shape", np.array([flat_shape[0], -1], np.int64), out)
            orig = self._const(f"{t}_shape", np.array(flat_shape, np.int64), out)
            src = self.new_name(f"{t}_flat")
            dst = self.new_name(f"{t}_flat_{spec.name}")
            out.nodes.append(helper.make_node("Reshape", [t, flat], [src],
                                              name=self.new_name(f"{t}_Reshape_flat")))
        out.nodes.append(helper.make_node(op_type, [src], [dst], domain=domain,
                                          name=self.new_name(f"{t}_{op_type}"),
                                          **spec.node_attrs(axis)))
        if flat_shape is not None:
            out.nodes.append(helper.make_node("Reshape", [dst, orig], [output],
                                              name=self.new_name(f"{t}_Reshape_back")))
        out.domains.add(domain)

    # -- BF16 ------------------------------------------------------------------------------
    def _bf16_params(self, out: Emitted, t: str, scale: float) -> tuple[str, str]:
        """The scale and zero-point inputs of the Extended pair / BF16QuantizeDequantize."""
        s_name, z_name = self._unit_bf16_params(out)
        if scale != 1.0:
            s_name = self._const(f"{t}_bf16_scale", np.array(scale, np.float32), out)
        return s_name, z_name

    def _fused_bf16(self, out: Emitted, t: str, output: str, scale: float) -> None:
        s_name, z_name = self._bf16_params(out, t, scale)
        op = "BF16QuantizeDequantize"
        out.nodes.append(helper.make_node(op, [t, s_name, z_name], [output], domain=OPS[op].domain,
                                          name=self.new_name(f"{t}_{op}")))
        out.domains.add(OPS[op].domain)

    def _extended_pair(self, out: Emitted, t: str, output: str, scale: float) -> None:
        s_name, z_name = self._bf16_params(out, t, scale)
        mid = self.new_name(f"{t}_QuantizeLinear_Output")
        # The Extended pair even with legacy_names, as Quark emits it.
        q_op, dq_op = "ExtendedQuantizeLinear", "ExtendedDequantizeLinear"
        out.nodes.append(helper.make_node(q_op, [t, s_name, z_name], [mid],
                                          domain=OPS[q_op].domain,
                                          name=self.new_name(f"{t}_QuantizeLinear")))
        out.nodes.append(helper.make_node(dq_op, [mid, s_name, z_name], [output],
                                          domain=OPS[dq_op].domain,
                                          name=self.new_name(f"{t}_DequantizeLinear")))
        out.domains.add(OPS[q_op].domain)

    def _bf16_cast_pair(self, out: Emitted, t: str, output: str, scale: float,
                        elem_type: Optional[int]) -> None:
        float_type = elem_type or TensorProto.FLOAT
        src, scale_name = t, None
        if scale != 1.0:
            np_type = helper.tensor_dtype_to_np_dtype(float_type)
            scale_name = self._const(f"{t}_bf16_scale", np.array(scale, np_type), out)
            src = self.new_name(f"{t}_scaled")
            out.nodes.append(helper.make_node("Div", [t, scale_name], [src],
                                              name=self.new_name(f"{t}_bf16_Div")))
        mid = self.new_name(f"{t}_bf16")
        back = self.new_name(f"{t}_bf16_float") if scale_name else output
        out.nodes.append(helper.make_node("Cast", [src], [mid], to=TensorProto.BFLOAT16,
                                          name=self.new_name(f"{t}_Cast_bf16")))
        out.nodes.append(helper.make_node("Cast", [mid], [back], to=float_type,
                                          name=self.new_name(f"{t}_Cast_float")))
        if scale_name:
            out.nodes.append(helper.make_node("Mul", [back, scale_name], [output],
                                              name=self.new_name(f"{t}_bf16_Mul")))

    def _unit_bf16_params(self, out: Emitted) -> tuple[str, str]:
        """The scale 1.0 and bfloat16 zero point 0 initializers, created once and shared."""
        if self._unit_params is None:
            s_name = self._const("bf16_scale", np.array(1.0, np.float32), out)
            z_name = self.new_name("bf16_zero_point")
            out.initializers.append(helper.make_tensor(z_name, TensorProto.BFLOAT16, [], [0]))
            self._unit_params = (s_name, z_name)
        return self._unit_params

    def _const(self, base: str, value: np.ndarray, out: Emitted) -> str:
        name = self.new_name(base)
        out.initializers.append(numpy_helper.from_array(value, name))
        return name
