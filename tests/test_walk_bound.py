"""``ort-mx-bench --walk-bound`` (benchmarks/walk_bound.py, walk_bound.cc): the program builds,
every walk's output equals its input bit for bit, bad shapes and options are refused with a
message, and the files are written. Times are not checked (speed is reported by benchmarks,
not tests)."""
from __future__ import annotations

import json
import subprocess

import pytest

from ort_mx_ops.benchmarks import cli, walk_bound


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return walk_bound.build(tmp_path_factory.mktemp("walk_bound"))


@pytest.mark.parametrize("shape,block", [((64, 64), 32), ((48, 96), 16), ((8, 32), 8)])
def test_every_walk_reproduces_its_input(program, shape, block):
    doc = walk_bound.run(program, shape, block, rounds=3)
    assert (doc["rows"], doc["cols"], doc["block"], doc["rounds"]) == (*shape, block, 3)
    assert doc["lanes"] in (4, 8, 16)
    walks = {w["name"]: w for w in doc["walks"]}
    assert set(walks) == {"negation", *walk_bound.WALKS}
    for name in walk_bound.WALKS:
        assert walks[name]["checked"] and walks[name]["equal"], name
    negation = walks["negation"]["best_us"]
    for w in walks.values():
        assert 0 < w["best_us"] <= w["median_us"]
        assert w["x_negation"] == pytest.approx(negation / w["best_us"])


def test_every_walk_reproduces_its_input_with_the_output_elsewhere(program):
    doc = walk_bound.run(program, (64, 1024), 32, rounds=2, output_offset=256)
    assert doc["output_offset"] == 256
    assert all(w["equal"] for w in doc["walks"] if w["checked"])


@pytest.mark.parametrize("args", [["30", "64", "32", "1"], ["64", "48", "32", "1"],
                                  ["64", "64", "12", "1"], ["64", "64", "32", "0"],
                                  ["64", "x", "32", "1"], ["64", "64", "32"],
                                  ["64", "64", "32", "1", "32"], ["64", "64", "32", "1", "4096"],
                                  ["64", "64", "32", "1", "-64"], ["64", "64", "32", "1", "0", "0"]])
def test_program_refuses_bad_arguments(program, args):
    done = subprocess.run([str(program), *args], capture_output=True, text=True)
    assert done.returncode == 2
    assert "walk_bound" in done.stderr and done.stdout == ""


def test_run_reports_the_program_failing(program):
    with pytest.raises(RuntimeError, match="exit 2"):
        walk_bound.run(program, (30, 64), 32, rounds=1)


def test_parse_shapes():
    assert walk_bound.parse_shapes("512x512, 256X1024,", 32) == [(512, 512), (256, 1024)]
    for text, message in [("512", "ROWSxCOLS"), ("40x64", "multiple of the block"),
                          ("64x48", "multiple of 32"), ("0x64", "positive"), ("", "no shapes")]:
        with pytest.raises(ValueError, match=message):
            walk_bound.parse_shapes(text, 32)


def test_main_writes_json_and_markdown(tmp_path):
    assert cli.main(["--walk-bound", "--shapes", "32x64,64x32", "--block", "32", "--rounds", "2",
                     "--out", str(tmp_path), "--quiet"]) == 0
    doc = json.loads((tmp_path / "walk_bound.json").read_text())
    assert doc["options"] == {"shapes": [[32, 64], [64, 32]], "block": 32, "rounds": 2,
                              "output_offset": 0}
    assert [(r["rows"], r["cols"]) for r in doc["results"]] == [(32, 64), (64, 32)]
    text = (tmp_path / "walk_bound.md").read_text()
    assert "| [32, 64] |" in text and "| [64, 32] |" in text
    assert all(f"{w} µs" in text for w in walk_bound.WALKS)


@pytest.mark.parametrize("argv,message", [(["--shapes", "40x64"], "multiple of the block"),
                                          (["--rounds", "0"], "at least 1"),
                                          (["--output-offset", "100"], "multiple of 64"),
                                          (["--output-offset", "4096"], "multiple of 64")])
def test_main_refuses_bad_options(tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        walk_bound.main(["--walk-bound", *argv, "--out", str(tmp_path), "--quiet"])
    assert not (tmp_path / "walk_bound.json").exists()


def test_a_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(RuntimeError, match="cannot run the C\\+\\+ compiler"):
        walk_bound.build(tmp_path)
    with pytest.raises(SystemExit, match="cannot run the C\\+\\+ compiler"):
        walk_bound.main(["--walk-bound", "--shapes", "32x32", "--out", str(tmp_path / "o"),
                         "--quiet"])
