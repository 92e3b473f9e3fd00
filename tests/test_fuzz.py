"""Seeded fuzzing through ONNX Runtime: a few thousand random valid and invalid nodes.

Valid nodes (random op name, attributes, shape, axis, dtype and bit patterns) must give
ort_mx_ops.reference's bits exactly; invalid ones (out-of-range or wrong-typed attributes,
unknown names, bad axes) must fail with an ONNX Runtime error naming the op, never crash.
MXOPS_FUZZ_SEED / MXOPS_FUZZ_CASES change the seed and the number of cases.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import POISON, assert_bits_equal, make_session, one_node_model, run_session
from ort_mx_ops import reference
from ort_mx_ops.formats import MX_ELEMENT_FORMATS

SEED = int(os.environ.get("MXOPS_FUZZ_SEED", "20261123"))
CASES = int(os.environ.get("MXOPS_FUZZ_CASES", "2500"))
OPS = {"BFP": [("BFPQuantizeDequantize", "com.amd.quark"), ("BFPFixNeuron", "com.vai.quantize")],
       "MX": [("MXQuantizeDequantize", "com.amd.quark"), ("MXFixNeuron", "com.vai.quantize")]}


def random_attrs(rng: np.random.Generator, kind: str) -> dict:
    """Valid attributes of `kind`, each set or left at its default at random."""
    a: dict = {}
    if rng.random() < 0.7:
        a["rounding_mode"] = int(rng.integers(0, 3))
    bs = int(rng.choice([1, 2, 3, 4, 5, 7, 8, 16, 32, 33, 64, 100]))
    if kind == "MX":
        if rng.random() < 0.9:
            a["element_dtype"] = str(rng.choice(list(MX_ELEMENT_FORMATS)))
        if rng.random() < 0.8:
            a["block_size"] = bs
        return a
    method = str(rng.choice(["to_bfp", "to_bfp_prime", "to_bfp_prime_shared"]))
    if method != "to_bfp" or rng.random() < 0.7:
        a["bfp_method"] = method
    a["bit_width"] = int(rng.integers(10, 33))
    if method == "to_bfp":
        a["block_size"] = bs
    else:
        sub = int(rng.choice([1, 2, 3, 4, 8]))
        a["sub_block_size"] = sub
        a["block_size"] = sub * int(rng.integers(1, 9))
        a["sub_block_shift_bits"] = int(rng.integers(0, 9))
    if rng.random() < 0.3:
        a["convert_to_bfloat_before_bfp"] = int(rng.integers(0, 2))
    return a


def break_attrs(rng: np.random.Generator, kind: str, a: dict) -> dict:
    """One way to make `a` invalid."""
    a = dict(a)
    choice = int(rng.integers(0, 9))
    if choice == 0:
        a["block_size"] = int(rng.choice([0, -1, -32, 2 ** 30 + 1]))
    elif choice == 1:
        a["rounding_mode"] = int(rng.choice([-1, 3, 7]))
    elif choice == 2:
        a["block_size"] = str(a.get("block_size", 8))          # string for int
    elif choice == 3:
        a["rounding_mode"] = float(a.get("rounding_mode", 0))  # float for int
    elif choice == 4:
        a["blocksize"] = 16                                     # misspelt name
    elif choice == 5 and kind == "MX":
        a["element_dtype"] = str(rng.choice(["fp3_e1m1", "int4", "", "INT8"]))
    elif choice == 5:
        a["bfp_method"] = str(rng.choice(["to_bfp_fancy", "", "TO_BFP"]))
    elif choice == 6 and kind == "MX":
        a["element_dtype"] = 8                                  # int for string
    elif choice == 6:
        a["bit_width"] = int(rng.choice([0, 9, 33, 64]))
    elif choice == 7 and kind == "BFP":
        a.update(bfp_method="to_bfp_prime", block_size=16, sub_block_size=int(rng.choice([3, 5, 32])))
    else:
        a["axis"] = "1"                                         # string for int
    return a


def random_input(rng: np.random.Generator, shape: tuple, elem: str) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    bits = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    normal = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    pick = rng.random(n)
    x = np.where(pick < 0.15, bits, normal.view(np.uint32))
    x = np.where((pick >= 0.15) & (pick < 0.25), bits & np.uint32(0x807FFFFF), x)  # subnormals
    x = np.where((pick >= 0.25) & (pick < 0.3), np.uint32(0), x)
    x = x.view(np.float32).reshape(shape)
    if elem == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            out = x.astype(np.float16)
        out.view(np.uint16)[out.view(np.uint16) == POISON["float16"]] = 0
        return out
    if elem == "bfloat16":
        out = reference.float32_to_bfloat16_bits(x)
        out[out == POISON["bfloat16"]] = 0
        return out
    x.view(np.uint32)[x.view(np.uint32) == POISON["float32"]] = 0
    return x


def test_fuzz_through_onnxruntime() -> None:
    rng = np.random.default_rng(SEED)
    valid = invalid = 0
    for case in range(CASES):
        kind = "BFP" if rng.random() < 0.5 else "MX"
        name, domain = OPS[kind][int(rng.random() < 0.2)]
        rank = int(rng.integers(0, 5))
        shape = tuple(int(d) for d in rng.integers(0 if rng.random() < 0.05 else 1, 13 if rank > 2 else 70, rank))
        elem = str(rng.choice(["float32", "float16", "bfloat16"]))
        attrs = random_attrs(rng, kind)
        if rank >= 2 or rng.random() < 0.3:
            attrs["axis"] = int(rng.integers(-max(rank, 1), max(rank, 1)))
        bad = rng.random() < 0.25
        if bad:
            attrs = break_attrs(rng, kind, attrs)
        elif rank >= 2 and int(np.prod(shape)) != 1 and rng.random() < 0.05:  # (one element: axis unused)
            attrs["axis"] = int(rng.choice([rank, -rank - 1, 99]))
            bad = True
        x = random_input(rng, shape, elem)
        context = f"case {case} (seed {SEED}): {name} {attrs} {elem} {shape}"
        if bad:
            with pytest.raises(Exception) as info:
                run_session(make_session(one_node_model(name, domain, attrs, elem)), x, elem)
            assert name in str(info.value), f"{context}: {info.value}"
            invalid += 1
            continue
        got = run_session(make_session(one_node_model(name, domain, attrs, elem)), x, elem)
        fn = reference.bfp_quantize_dequantize if kind == "BFP" else reference.mx_quantize_dequantize
        expected = fn(x, dtype="bfloat16" if elem == "bfloat16" else None, **attrs)
        assert_bits_equal(got, expected, context)
        valid += 1
    assert valid > CASES // 2 and invalid > CASES // 10, (valid, invalid)
