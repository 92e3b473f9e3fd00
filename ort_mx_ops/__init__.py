"""ort-mx-ops: ONNX Runtime custom ops for block number formats.

Load the ops into a session::

    import onnxruntime as ort, ort_mx_ops
    so = ort.SessionOptions()
    so.register_custom_ops_library(ort_mx_ops.get_library_path())   # or ort_mx_ops.register(so)

``ort_mx_ops.formats`` is the catalogue of ops, attributes and number formats;
``ort_mx_ops.reference`` has numpy implementations of every op (docs/formats.md);
``ort_mx_ops.native`` runs the CPU kernels on numpy arrays; ``ort_mx_ops.quantizer`` inserts
the ops into ONNX graphs (docs/quantizer.md).  ``make_node`` builds the node(s) of one
format and ``opset_imports`` adds the domains a model needs (``ort_mx_ops.quantizer.surgery``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"
__all__ = ["get_library_path", "register", "available_devices", "make_node", "opset_imports",
           "__version__"]

_PACKAGE_DIR = Path(__file__).resolve().parent
_LIBRARIES = {"CPU": "libort_mx_ops_cpu.so", "CUDA": "libort_mx_ops_cuda.so",
              "ROCM": "libort_mx_ops_rocm.so"}


def get_library_path(device: str = "CPU") -> str:
    """Path of the custom-op library for ``device`` ("CPU", "CUDA" or "ROCM").

    The CUDA and ROCm libraries also register the CPU kernels, so one library serves a
    session that places nodes on either. Raises FileNotFoundError, saying why, when the
    library for that device was not built (its compiler was not found at install time).
    """
    key = device.upper()
    if key not in _LIBRARIES:
        raise ValueError(f"device must be one of {sorted(_LIBRARIES)}, got {device!r}")
    path = _PACKAGE_DIR / _LIBRARIES[key]
    if not path.exists():
        hint = {"CPU": "reinstall the package (pip install .)",
                "CUDA": "it is built only where nvcc was found at install time",
                "ROCM": "it is built only where hipcc was found at install time"}[key]
        raise FileNotFoundError(f"ort-mx-ops {key} library not found at {path}: {hint}")
    return str(path)


def available_devices() -> list[str]:
    """The devices whose library this installation carries."""
    return [d for d, name in _LIBRARIES.items() if (_PACKAGE_DIR / name).exists()]


def register(sess_options: Any, device: str = "CPU") -> Any:
    """Registers the ops with an ``onnxruntime.SessionOptions`` and returns it."""
    sess_options.register_custom_ops_library(get_library_path(device))
    return sess_options


def __getattr__(name: str) -> Any:
    # make_node and opset_imports need onnx: imported on first use, not with the package.
    if name in ("make_node", "opset_imports"):
        from .quantizer import surgery
        return getattr(surgery, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
