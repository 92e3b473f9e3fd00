"""``quantize_model``: insert BFP / MX / BF16 quantize-dequantize nodes into an ONNX model.

The steps, each in its own module: :mod:`.placement` decides the tensors and their axes,
:mod:`.calibration` measures ranges where a BF16 scale needs them, this module rewrites the
graph (folding weights offline with the native kernels, or inserting runtime nodes) and
writes the result atomically; :mod:`.summary` describes what was done.
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Optional, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from ort_mx_ops import reference

from .calibration import collect_abs_max, CalibrationDataReader
from .config import QuantizationConfig, FormatSpec, get_config
from .graph import ModelView
from .nodes import NodeFactory
from .placement import plan_model, Site
from .storage import StoredWeight, apply_weight_storage, check_weight_storage
from .summary import QuantizationSummary, SiteRecord

__all__ = ["quantize_model", "fold_weight", "save_model_atomic", "check_output",
           "EXTERNAL_DATA_THRESHOLD"]

# Protobuf cannot serialise a message of 2 GiB or more; stay clear of it with some margin.
EXTERNAL_DATA_THRESHOLD = 2 * 1024 ** 3 - 64 * 1024 ** 2

ModelInput = Union[str, os.PathLike, onnx.ModelProto]


def _native():
    try:
        from ort_mx_ops import native  # the pybind11 module built with the library
    except ImportError as exc:
        raise RuntimeError(
            "folding weights needs the native kernels (ort_mx_ops.native), which this "
            "installation lacks; reinstall the package so that its extension builds, or pass "
            "fold_weights=False to keep a runtime node on each weight") from exc
    return native


def fold_weight(values: np.ndarray, spec: FormatSpec, axis: Optional[int],
                bf16_scale: float = 1.0, flatten: bool = False) -> np.ndarray:
    """The values a runtime node of ``spec`` along ``axis`` would produce for the constant
    ``values``, bit for bit: BFP and MX through the native kernels (the same code the ORT op
    runs), BF16 through the Extended Q/DQ formulas with ``bf16_scale``.  ``flatten`` views
    ``values`` as (shape[0], -1) first (the runtime form's Reshape pair)."""
    if flatten and values.ndim > 2:
        flat = values.reshape(values.shape[0], -1)
        return fold_weight(flat, spec, axis, bf16_scale).reshape(values.shape)
    if spec.op == "BF16":
        scale = np.float32(bf16_scale)
        zp = np.zeros((), dtype=np.uint16)
        q = reference.extended_quantize_linear(values.astype(np.float32), scale, zp)
        return reference.extended_dequantize_linear(q, scale, zp).astype(values.dtype)
    native = _native()
    attrs = spec.node_attrs(0 if axis is None else axis)
    fn = native.bfp_quantize_dequantize if spec.op == "BFP" else native.mx_quantize_dequantize
    out = np.asarray(fn(np.ascontiguousarray(values), **attrs))
    if out.shape != values.shape or out.dtype != values.dtype:
        raise RuntimeError(f"native {spec.op} kernel returned {out.dtype}{out.shape} for "
                           f"{values.dtype}{values.shape}")
    return out


class _Names:
    """Fresh tensor and node names that collide with nothing in the graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.used: set[str] = {i.name for i in graph.initializer} | \
            {i.name for i in graph.input} | {o.name for o in graph.output} | \
            {n.name for n in graph.node}
        for n in graph.node:
            self.used.update(n.input)
            self.used.update(n.output)

    def new(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


def _load(model_input: ModelInput) -> tuple[onnx.ModelProto, Optional[str]]:
    if isinstance(model_input, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model_input)  # never modify the caller's object
        return m, None
    path = os.fspath(model_input)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"input model {path} is not a file" if os.path.exists(path)
                                else f"model file not found: {path}")
    try:
        model = onnx.load(path, load_external_data=True)
    except Exception as exc:  # protobuf's DecodeError, a missing external data file, ...
        raise ValueError(f"input model {path} is not a readable ONNX model "
                         f"({type(exc).__name__}: {exc})") from None
    if not model.HasField("graph"):
        raise ValueError(f"input model {path} is not an ONNX model (it has no graph)")
    return model, path


def _tensors(graph: onnx.GraphProto):
    """Every TensorProto in ``graph``: initializers, tensor attributes, subgraphs'."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            yield from a.tensors
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []) + list(a.graphs):
                yield from _tensors(g)


def _refuse_input_files(targets: list[str], input_model: str) -> None:
    """``ValueError`` if a path in ``targets`` is ``input_model`` or a file that model keeps
    tensors in (its external data): those must never be written."""
    existing = [t for t in targets if os.path.exists(t)]
    if not existing:
        return  # nothing there to overwrite; no need to read the input again
    header = onnx.load(input_model, load_external_data=False)
    base = os.path.dirname(os.path.abspath(input_model))
    stored = {os.path.abspath(input_model)} | {
        os.path.join(base, e.value) for t in _tensors(header.graph)
        for e in t.external_data if e.key == "location"}
    for target in existing:
        if any(os.path.exists(p) and os.path.samefile(p, target) for p in stored):
            raise ValueError(f"refusing to write {target}: the input model is stored in that "
                             "file; choose another output name")


def _check_output_dir(path: str) -> None:
    """Refuse, as ``cp`` does, an output whose directory does not exist, or a directory."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"output directory {directory} does not exist; create it "
                                "first (nothing was written)")
    if os.path.isdir(path):
        raise ValueError(f"output {path} is a directory; give a file name")


def check_output(input_model: str, output: str) -> None:
    """Refuse, before any work, an output whose directory is missing, that is a directory,
    or that is the input model or one of its external data files."""
    _check_output_dir(output)
    if _same_file(input_model, output):
        raise ValueError(f"refusing to write over the input model {input_model!r}; choose "
                         "another output path")
    _refuse_input_files([output], input_model)


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def _default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def _tensor_bytes(model: onnx.ModelProto) -> int:
    total = sum(len(t.raw_data) or numpy_helper.to_array(t).nbytes
                for t in model.graph.initializer)
    for n in model.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                total += len(a.t.raw_data)
    return total


def save_model_atomic(model: onnx.ModelProto, path: str,
                      external_threshold: int = EXTERNAL_DATA_THRESHOLD,
                      input_model: Optional[str] = None) -> list[str]:
    """Check ``model`` with ``onnx.checker`` and write it to ``path`` through a temporary file
    and ``os.replace``, so a reader never sees a half-written model.  Tensors go to
    ``<name>.data`` beside it when they total ``external_threshold`` bytes or more (0: always;
    tensors under 1 KiB stay in the model).  Writes nothing and raises ``FileNotFoundError``
    where the directory does not exist, ``ValueError`` where a file to write is
    ``input_model`` or one of its external data files.  Returns the paths written: the
    model, then its data file if any."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    _check_output_dir(path)
    external = _tensor_bytes(model) >= external_threshold
    location = os.path.basename(path) + ".data"
    targets = [path] + ([os.path.join(directory, location)] if external else [])
    if input_model is not None:
        _refuse_input_files(targets, input_model)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".ort-mx-quantize-") as tmp:
        tmp_model = os.path.join(tmp, os.path.basename(path))
        if external:
            # Saving with external data rewrites the proto's tensors; keep the caller's intact.
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            onnx.save_model(copy, tmp_model, save_as_external_data=True,
                            all_tensors_to_one_file=True, location=location,
                            size_threshold=1024, convert_attribute=True)
            onnx.checker.check_model(tmp_model)
            if os.path.exists(os.path.join(tmp, location)):
                os.replace(os.path.join(tmp, location), targets[1])
            else:  # every tensor was under 1 KiB: all stayed in the model
                targets.pop()
        else:
            onnx.checker.check_model(model)
            onnx.save_model(model, tmp_model)
        os.replace(tmp_model, path)
    return targets


def _add_opset(model: onnx.ModelProto, domain: str) -> None:
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, 1))


def quantize_model(model_input: ModelInput, model_output: Optional[Union[str, os.PathLike]],
                   config: Union[str, QuantizationConfig],
                   calibration_data_reader: Optional[CalibrationDataReader] = None,
                   *, progress: bool = False, external_data: bool = False,
                   **options: Any) -> QuantizationSummary:
    """Quantize ``model_input`` (a path or a ModelProto, which is left untouched) with
    ``config`` (a built-in name such as ``"MXFP8E4M3"``, or a :class:`QuantizationConfig`)
    and write the result to ``model_output`` (None: only return it, as ``summary.model``).

    Files: ``model_output``'s directory must exist (``FileNotFoundError`` otherwise, before
    any work); neither the input file nor a file it keeps tensors in is ever written
    (``ValueError``); the tensors go to ``<output>.data`` beside the model with
    ``external_data=True``, and always from 2 GiB.  Subgraphs (If, Loop, Scan) are not
    quantized: what they read keeps its float values.

    ``options`` override config fields: ``activation`` / ``weight`` (a FormatSpec, a built-in
    name, or None for float: ``quantize_model(m, out, "MXFP4E2M1", activation="MXINT8")``
    gives 4-bit weights and 8-bit activations, ``activation=None`` weight-only),
    ``tensor_formats`` ({tensor name: FormatSpec, name or None} for single tensors),
    ``op_types_to_quantize``, ``nodes_to_exclude``, ``quantize_all_op_types``, ``placement``
    ("default" or "quark"), ``fold_weights``, ``legacy_names``, ``bf16_qdq_to_cast``,
    ``bf16_weight_scaled``, ``bf16_activation_scaled``, ``bf16_scale_target``,
    ``quantize_bias``, ``weight_storage`` ("folded", "packed" or "onnx": how folded weights
    are written, docs/packed_weights.md), and the accuracy algorithms ``weight_rounding``
    ("nearest" or "gptq"), ``fast_finetune`` (AdaQuant: a :class:`FastFinetune`, a dict of
    its options, or True; the ``<NAME>_ADAQUANT`` configs turn it on) and
    ``bias_correction``, and ``cross_layer_equalization`` (equal per-channel weight ranges
    between consecutive layers, float outputs unchanged; needs no calibration data).
    ``calibration_data_reader`` follows onnxruntime's
    ``CalibrationDataReader``; it is read where a range is needed (BF16 activation
    rescaling) and by the accuracy algorithms, which raise ``ValueError`` naming it when it
    is missing.  ``"MX9_INT8"`` is MX9 activations over MXINT8 weights;
    ``"BF16_MIXED_BFP16"`` / ``"BF16_MIXED_MXINT8"`` run
    :func:`~.mixed_precision.auto_mixed_precision` over that pair (``target=`` and
    ``metric=`` in ``options``; without a target every tensor takes the block format).

    The output keeps the input's IR version, opsets (``weight_storage="onnx"`` raises them to
    IR 10 / opset 21 where lower), graph inputs, outputs and tensor names,
    imports the custom domains it uses at version 1, passes ``onnx.checker``, and is never
    written over the input file.  Returns a :class:`QuantizationSummary`."""
    if isinstance(config, str) and config.upper() in ("BF16_MIXED_BFP16", "BF16_MIXED_MXINT8"):
        # Quark's searched presets: the mixed-precision search over the preset's pair.
        from .mixed_precision import auto_mixed_precision
        return auto_mixed_precision(model_input, model_output, calibration_data_reader,
                                    config, progress=progress, **options)
    start = time.perf_counter()
    cfg = get_config(config, **options)
    if model_output is not None:
        _check_output_dir(os.fspath(model_output))  # before any work, as cp does
    if model_output is not None and not isinstance(model_input, onnx.ModelProto):
        if _same_file(os.fspath(model_input), os.fspath(model_output)):
            raise ValueError(f"refusing to write the quantized model over its input "
                             f"{os.fspath(model_input)!r}; choose another output path")
    model, in_path = _load(model_input)
    input_bytes = os.path.getsize(in_path) if in_path else model.ByteSize()
    uses_bf16 = any(s is not None and s.op == "BF16"
                    for s in (cfg.activation, cfg.weight, *cfg.tensor_formats.values()))
    if uses_bf16 and cfg.bf16_qdq_to_cast and _default_opset(model) < 13:
        raise ValueError(f"bf16_qdq_to_cast needs ONNX opset >= 13 (Cast to BFLOAT16); this "
                         f"model imports opset {_default_opset(model)}. Use the Extended Q/DQ "
                         "pair (the default) or convert the model's opset first")

    base_dir = os.path.dirname(in_path) if in_path else None
    equalization = None
    if cfg.cross_layer_equalization:
        from .equalization import equalize_model
        model, equalization = equalize_model(model, base_dir)
    rotation = None
    if cfg.hadamard_rotation:
        from .rotation import rotate_model
        ops = ("MatMul", "Gemm") if cfg.quantize_all_op_types else cfg.op_types_to_quantize
        model, rotation = rotate_model(model, base_dir, ops, cfg.nodes_to_exclude)
        # The rotation nodes stay float; the tuning below sees the rotated model.
        cfg = cfg.replace(hadamard_rotation=False, nodes_to_exclude=(
            *cfg.nodes_to_exclude, *rotation.added_nodes))
    tuning = None
    if cfg.weight_rounding != "nearest" or cfg.fast_finetune is not None or \
            cfg.bias_correction:
        model, tuning, calibration_data_reader = _tune(model, cfg, calibration_data_reader,
                                                       base_dir, progress)
    view = ModelView(model, base_dir=base_dir)
    plan = plan_model(view, cfg)
    for site in plan.sites:  # before any work: a format the chosen storage cannot hold
        if site.kind == "weight":
            check_weight_storage(cfg.weight_storage, site.spec)

    # Ranges, where a BF16 scale is derived from them.
    act_scales: dict[str, float] = {}
    scaled_acts = [s.tensor for s in plan.sites
                   if s.kind == "activation" and s.spec.op == "BF16" and cfg.bf16_activation_scaled]
    if scaled_acts:
        if calibration_data_reader is None:
            raise ValueError("bf16_activation_scaled needs a calibration_data_reader "
                             "(MinMax calibration of the activation ranges)")
        ranges = collect_abs_max(model, scaled_acts, calibration_data_reader, progress=progress)
        act_scales = {t: _scale_from_range(r, cfg.bf16_scale_target) for t, r in ranges.items()}

    rewriter = _Rewriter(model, view, cfg)
    records = [rewriter.apply(site, act_scales.get(site.tensor)) for site in plan.sites]
    plan.skipped.extend(rewriter.skipped)
    rewriter.finish()
    if cfg.weight_storage != "folded":
        stored = [StoredWeight(r.output, site.spec, site.axis, site.flatten)
                  for site, r in zip(plan.sites, records)
                  if r is not None and r.folded and site.kind == "weight"]
        plan.skipped.extend(apply_weight_storage(model, stored, cfg.weight_storage))
    records = [r for r in records if r is not None]

    summary = QuantizationSummary(
        config=cfg.name, placement=cfg.placement, fold_weights=cfg.fold_weights,
        sites=records, skipped=plan.skipped, conflicts=plan.conflicts,
        input_bytes=input_bytes, model=model, tuning=tuning, equalization=equalization,
        rotation=rotation)
    if model_output is not None:
        written = save_model_atomic(model, os.fspath(model_output),
                                    0 if external_data else EXTERNAL_DATA_THRESHOLD, in_path)
        summary.output_bytes = sum(os.path.getsize(p) for p in written)
    else:
        onnx.checker.check_model(model)
        summary.output_bytes = model.ByteSize()
    summary.seconds = time.perf_counter() - start
    return summary


class _Replay:
    """A CalibrationDataReader over batches already read."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds, self.pos = feeds, 0

    def __len__(self) -> int:
        return len(self.feeds)

    def get_next(self) -> Optional[dict[str, np.ndarray]]:
        if self.pos >= len(self.feeds):
            return None
        self.pos += 1
        return self.feeds[self.pos - 1]


def _tune(model: onnx.ModelProto, cfg: QuantizationConfig,
          reader: Optional[CalibrationDataReader], base_dir: Optional[str], progress: bool):
    """Run the accuracy algorithms of ``cfg``: the tuned float model, the report, and a
    reader that replays the calibration batches for later steps."""
    from .adaquant import FastFinetune
    from .tuning import read_feeds, tune_model
    wanted = ([f"weight_rounding={cfg.weight_rounding!r}"]
              if cfg.weight_rounding != "nearest" else []) + \
        (["fast_finetune (the *_ADAQUANT configs)"] if cfg.fast_finetune else []) + \
        (["bias_correction"] if cfg.bias_correction else [])
    feeds = read_feeds(reader, (cfg.fast_finetune or FastFinetune()).data_size,
                       " and ".join(wanted))
    tuned, report = tune_model(model, cfg, feeds, weight_rounding=cfg.weight_rounding,
                               fast_finetune=cfg.fast_finetune,
                               bias_correction=cfg.bias_correction, base_dir=base_dir,
                               progress=progress)
    return tuned, report, _Replay(feeds)


def _scale_from_range(abs_max: float, target: float) -> float:
    """Scale that maps ``abs_max`` to ``target`` (1.0 for an all-zero tensor)."""
    if not np.isfinite(abs_max) or abs_max <= 0:
        return 1.0
    return float(np.float32(abs_max) / np.float32(target))


class _Rewriter:
    """Applies sites to the graph: folds weights or queues runtime nodes, then rebuilds the
    node list with each inserted node placed just before its first consumer."""

    def __init__(self, model: onnx.ModelProto, view: ModelView, cfg: QuantizationConfig):
        self.model, self.view, self.cfg = model, view, cfg
        self.graph = model.graph
        self.names = _Names(self.graph)
        self.names.used |= view.subgraph_names  # a new name must not shadow a subgraph's
        self.before: dict[int, list[onnx.NodeProto]] = {}
        self.new_inits: list[onnx.TensorProto] = []
        self.domains: set[str] = set()
        self.skipped: list[str] = [f"subgraphs of {node}: not quantized (they keep reading "
                                   "the float tensors)" for node in view.subgraph_nodes]
        self.factory = NodeFactory(self.names.new, legacy_names=cfg.legacy_names,
                                   bf16_cast=cfg.bf16_qdq_to_cast,
                                   bf16_fused=cfg.bf16_qdq_fused)

    # -- helpers -------------------------------------------------------------------------
    def _rewire(self, site: Site, new_name: str) -> None:
        for node_idx, k in site.consumers:
            self.graph.node[node_idx].input[k] = new_name

    def _insert(self, site: Site, nodes: list[onnx.NodeProto]) -> None:
        first = min(i for i, _ in site.consumers)
        self.before.setdefault(first, []).extend(nodes)

    def _weight_scale(self, site: Site, values: Optional[np.ndarray]) -> float:
        if site.spec.op != "BF16" or not self.cfg.bf16_weight_scaled:
            return 1.0
        if values is None:
            values = self.view.weights[site.tensor].array(self.view.base_dir)
        finite = np.abs(values[np.isfinite(values)]).astype(np.float32)
        return _scale_from_range(float(finite.max()) if finite.size else 0.0,
                                 self.cfg.bf16_scale_target)

    # -- one site ------------------------------------------------------------------------
    def apply(self, site: Site, act_scale: Optional[float]) -> Optional[SiteRecord]:
        elem = self.view.elem_type.get(site.tensor)
        if site.spec.op == "BF16" and elem not in (None, TensorProto.FLOAT) and \
                not self.cfg.bf16_qdq_to_cast:
            self.skipped.append(f"{site.tensor}: BF16 Extended Q/DQ and BF16QuantizeDequantize "
                                f"take float32 tensors; "
                                f"this one is {TensorProto.DataType.Name(elem)}; left float")
            return None
        if site.kind == "weight" and self.cfg.fold_weights:
            return self._fold(site)
        scale = act_scale if site.kind == "activation" else None
        if site.kind == "weight":
            scale = self._weight_scale(site, None)
        return self._runtime(site, 1.0 if scale is None else scale, elem)

    def _fold(self, site: Site) -> SiteRecord:
        ref = self.view.weights[site.tensor]
        values = ref.array(self.view.base_dir)
        scale = self._weight_scale(site, values)
        folded = fold_weight(values, site.spec, site.axis, scale, site.flatten)
        all_consumers = self.view.consumers.get(site.tensor, [])
        # A graph output or a tensor a subgraph reads must keep its float values.
        exclusive = len(all_consumers) == len(site.consumers) and \
            site.tensor not in self.view.graph_outputs and \
            site.tensor not in self.view.subgraph_names
        if exclusive:
            # Every reader gets the quantized values: replace the tensor under its own name.
            new_t = numpy_helper.from_array(folded, site.tensor)
            ref.tensor.CopyFrom(new_t)
            name = site.tensor
        else:
            name = self.names.new(f"{site.tensor}_{site.spec.name}_folded")
            self.new_inits.append(numpy_helper.from_array(folded, name))
            self._rewire(site, name)
        return SiteRecord.from_site(site, folded=True, numel=int(values.size),
                                    itemsize=values.dtype.itemsize, bf16_scale=scale,
                                    output=name)

    def _runtime(self, site: Site, scale: float, elem: Optional[int]) -> SiteRecord:
        t = site.tensor
        if site.spec.op == "BF16":
            out = self.names.new(f"{t}_DequantizeLinear_Output")
        else:
            out = self.names.new(f"{t}_{site.spec.name}")
        shape = self.view.shape.get(t)
        flat_shape = shape if site.flatten and shape is not None and len(shape) > 2 else None
        emitted = self.factory.quantize(site.spec, t, out, site.axis, bf16_scale=scale,
                                        elem_type=elem, flat_shape=flat_shape)
        self.new_inits.extend(emitted.initializers)
        self.domains |= emitted.domains
        self._insert(site, emitted.nodes)
        self._rewire(site, out)
        ref = self.view.weights.get(t)
        numel, itemsize = 0, 4
        if ref is not None:
            numel = int(np.prod(ref.tensor.dims)) if ref.tensor.dims else 1
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(ref.tensor.data_type).itemsize
        return SiteRecord.from_site(site, folded=False, numel=numel, itemsize=itemsize,
                                    bf16_scale=scale if site.spec.op == "BF16" else None,
                                    output=out, runtime_nodes=[n.op_type for n in emitted.nodes])

    # -- rebuild -------------------------------------------------------------------------
    def finish(self) -> None:
        nodes = list(self.graph.node)
        rebuilt: list[onnx.NodeProto] = []
        for idx, node in enumerate(nodes):
            rebuilt.extend(self.before.get(idx, []))
            rebuilt.append(node)
        del self.graph.node[:]
        self.graph.node.extend(rebuilt)
        self.graph.initializer.extend(self.new_inits)
        if self.model.ir_version < 4:
            # Before IR 4 every initializer must also be a graph input.
            for init in self.new_inits:
                self.graph.input.append(helper.make_tensor_value_info(
                    init.name, init.data_type, list(init.dims)))
        for domain in sorted(self.domains):
            _add_opset(self.model, domain)
