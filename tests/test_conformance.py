"""AMD Quark 0.13's own outputs (tests/data/conformance, copied from the product's shared
conformance set): every case must come out bit for bit, through onnxruntime and through the
pybind module."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_bits_equal, run_one_node
from ort_mx_ops import native, reference

DATA = Path(__file__).parent / "data" / "conformance"
CASES = json.loads((DATA / "cases.json").read_text())
INPUTS = np.load(DATA / "inputs.npz")
EXPECTED = np.load(DATA / "expected.npz")
DOMAINS = {"BFPQuantizeDequantize": "com.amd.quark", "MXQuantizeDequantize": "com.amd.quark",
           "BFPFixNeuron": "com.vai.quantize", "MXFixNeuron": "com.vai.quantize"}


def test_all_cases_present() -> None:
    assert len(CASES) == 104
    assert {c["id"] for c in CASES} <= set(EXPECTED.files)
    assert str(EXPECTED["errors"]) == "{}"  # Quark raised no error on any case


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_onnxruntime_matches_quark(case: dict) -> None:
    x = INPUTS[case["input"]]
    elem = "float16" if x.dtype == np.float16 else "float32"
    y = run_one_node(case["op"], DOMAINS[case["op"]], case["attrs"], x, elem, threads=2)
    assert_bits_equal(y, EXPECTED[case["id"]], f"{case['id']} {case['attrs']}")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_native_and_reference_match_quark(case: dict) -> None:
    x = INPUTS[case["input"]]
    is_bfp = case["op"].startswith("BFP")
    fn_native = native.bfp_quantize_dequantize if is_bfp else native.mx_quantize_dequantize
    fn_ref = reference.bfp_quantize_dequantize if is_bfp else reference.mx_quantize_dequantize
    assert_bits_equal(fn_native(x, **case["attrs"]), EXPECTED[case["id"]], "native")
    assert_bits_equal(fn_ref(x, **case["attrs"]), EXPECTED[case["id"]], "reference")
