"""The ort_mx_ops quantizer: put BFP, MX and BF16 quantize-dequantize nodes into ONNX models.

``quantize_model(model_input, model_output, "MXFP8E4M3")`` quantizes the inputs of Conv,
ConvTranspose, Gemm and MatMul along their reduction axes and folds the weights offline;
``activation="MXINT8"`` gives activations another format, ``activation=None`` keeps them
float.  See :class:`QuantizationConfig` for every option, :mod:`.handlers` for what each op
type contributes, docs/quantizer.md, and ``ort-mx-quantize --help`` for the CLI.
``insert_qdq(model, {"conv3_out": "MXFP8E4M3"})`` puts nodes on the tensors you name and
``strip_qdq(model)`` takes them out again (:mod:`.surgery`).
"""
from .config import (FormatSpec, QuantizationConfig, get_config, config_names,
                     DEFAULT_OP_TYPES)
from .handlers import (OpHandler, Layer, handler_for, register_handler, layers, COMPUTE_OPS)
from .nodes import NodeFactory
from .quantize import quantize_model, fold_weight
from .summary import QuantizationSummary
from .calibration import CalibrationDataReader
from .surgery import insert_qdq, strip_qdq, make_node, opset_imports

__all__ = ["quantize_model", "fold_weight", "FormatSpec", "QuantizationConfig", "get_config",
           "config_names", "DEFAULT_OP_TYPES", "COMPUTE_OPS", "QuantizationSummary",
           "CalibrationDataReader", "OpHandler", "Layer", "handler_for", "register_handler",
           "layers", "NodeFactory", "insert_qdq", "strip_qdq", "make_node", "opset_imports"]
