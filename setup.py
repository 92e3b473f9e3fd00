"""Build of ort-mx-ops: the CPU custom-op library, the pybind11 module, and the CUDA / ROCm
libraries where their compilers are found. ninja drives the native build.

ONNX Runtime's C/C++ headers come from a package at build time (never copied into the
repository), in order:
  1. $ORT_INCLUDE_DIR, a folder holding onnxruntime_c_api.h;
  2. a system install (/usr/include/onnxruntime, e.g. Debian's libonnxruntime-dev);
  3. Debian's libonnxruntime-dev, downloaded with apt-get into the build folder (not
     installed), from the archive this machine's own apt configuration names, for the suite
     $MXOPS_DEBIAN_SUITE (default "trixie").
Environment switches: MXOPS_NO_CUDA=1 / MXOPS_NO_ROCM=1 skip a GPU backend;
MXOPS_CUDA_ARCHS (default "80;90;100") and MXOPS_ROCM_ARCHS (default "gfx90a;gfx908;gfx1030");
MXOPS_BUILD_JOBS (default: all cores).

Next to each GPU library a test library is linked from the same objects plus the C entry
points of csrc/cuda/test_entry.cu, into build/gpu-tests/ of the source tree (never into the
package): tests/test_gpu_kernels.py drives the kernels through it without onnxruntime-gpu.
"""
from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CXXFLAGS = "-std=c++17 -O3 -fPIC -fvisibility=hidden -ffp-contract=off -Wall -Wextra"
# MXOPS_SANITIZE=1 (CI's sanitizer job): only the CPU library, with AddressSanitizer and
# UndefinedBehaviorSanitizer, into build/sanitize/ (never installed); any report aborts.
SANITIZE = bool(os.environ.get("MXOPS_SANITIZE"))
# -g1: line tables for the reports' stack traces; full -g spent 17 % of the build in variable
# tracking (-ftime-report, one part of the AVX2 walkers).
SANITIZE_FLAGS = "-O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
SANITIZE_DIR = ROOT / "build" / "sanitize"
MIN_ORT_API_VERSION = 21  # the API the library is written against (onnxruntime >= 1.21)
GPU_TEST_DIR = ROOT / "build" / "gpu-tests"


def log(message: str) -> None:
    print(f"[ort-mx-ops build] {message}", flush=True)


def announce(message: str) -> None:
    """Prints `message` where the user sees it: pip hides a build's output unless -v, so the
    line also goes to the terminal directly when there is one."""
    log(message)
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"[ort-mx-ops build] {message}\n")
    except OSError:
        pass  # no terminal (CI): the line is in the build log


# --------------------------------------------------------------------------------------------
# ONNX Runtime headers
# --------------------------------------------------------------------------------------------

def _ort_api_version(include_dir: Path) -> int | None:
    header = include_dir / "onnxruntime_c_api.h"
    if not header.is_file():
        return None
    match = re.search(r"#define ORT_API_VERSION (\d+)", header.read_text(errors="replace"))
    return int(match.group(1)) if match else None


def _debian_archive_uri() -> tuple[str, str]:
    """The main Debian archive URI and keyring that this machine's apt configuration uses."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        stanza_uri, keyring, suites = None, None, ""
        for line in Path(path).read_text().splitlines() + [""]:
            key, _, value = line.partition(":")
            if key.strip() == "URIs":
                stanza_uri = value.split()[0]
            elif key.strip() == "Signed-By":
                keyring = value.strip()
            elif key.strip() == "Suites":
                suites = value
            elif not line.strip() and stanza_uri:
                if "security" not in suites and "security" not in stanza_uri:
                    return stanza_uri, keyring or "/usr/share/keyrings/debian-archive-keyring.gpg"
                stanza_uri, keyring, suites = None, None, ""
    if os.path.exists("/etc/apt/sources.list"):
        for line in Path("/etc/apt/sources.list").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and "security" not in line:
                uri = next(p for p in parts[1:] if "://" in p)
                return uri, "/usr/share/keyrings/debian-archive-keyring.gpg"
    raise RuntimeError("no Debian archive found in /etc/apt (sources.list or sources.list.d)")


def _fetch_debian_headers(dest: Path) -> Path:
    suite = os.environ.get("MXOPS_DEBIAN_SUITE", "trixie")
    uri, keyring = _debian_archive_uri()
    apt_dir = dest / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "etc"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    sources = apt_dir / "etc" / "sources.list"
    sources.write_text(f"deb [signed-by={keyring}] {uri} {suite} main\n")
    options = [f"-o=Dir::Etc::SourceList={sources}", "-o=Dir::Etc::SourceParts=/dev/null",
               f"-o=Dir::State::Lists={apt_dir / 'lists'}", f"-o=Dir::Cache={apt_dir / 'cache'}",
               "-o=Dir::State::status=/dev/null", "-o=APT::Sandbox::User=root"]
    log(f"fetching libonnxruntime-dev headers from Debian {suite} with apt-get (not installed)")
    subprocess.run(["apt-get", *options, "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", *options, "download", "libonnxruntime-dev"], check=True,
                   cwd=apt_dir, stdout=subprocess.DEVNULL)
    deb = next(apt_dir.glob("libonnxruntime-dev_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest / "root")], check=True)
    return dest / "root" / "usr" / "include" / "onnxruntime"


def find_ort_headers(build_dir: Path) -> Path:
    """A folder with ONNX Runtime's C/C++ API headers (see the module docstring)."""
    candidates = []
    if os.environ.get("ORT_INCLUDE_DIR"):
        candidates.append(Path(os.environ["ORT_INCLUDE_DIR"]))
    candidates += [Path("/usr/include/onnxruntime"),
                   build_dir / "ort-headers" / "root" / "usr" / "include" / "onnxruntime"]
    for include_dir in candidates:
        version = _ort_api_version(include_dir)
        if version is not None and version >= MIN_ORT_API_VERSION:
            log(f"ONNX Runtime headers: {include_dir} (ORT_API_VERSION {version})")
            return include_dir
    try:
        include_dir = _fetch_debian_headers(build_dir / "ort-headers")
    except (OSError, subprocess.CalledProcessError, RuntimeError, StopIteration) as exc:
        raise RuntimeError(
            "ort-mx-ops needs ONNX Runtime's C API headers (ORT_API_VERSION >= "
            f"{MIN_ORT_API_VERSION}) and could not fetch Debian's libonnxruntime-dev ({exc}). "
            "Install libonnxruntime-dev or set ORT_INCLUDE_DIR to a folder holding "
            "onnxruntime_c_api.h and onnxruntime_cxx_api.h.") from exc
    version = _ort_api_version(include_dir)
    log(f"ONNX Runtime headers: {include_dir} (ORT_API_VERSION {version})")
    return include_dir


# --------------------------------------------------------------------------------------------
# The ninja build
# --------------------------------------------------------------------------------------------

COMMON_SOURCES = ["csrc/common/params.cc", "csrc/cpu/qdq_cpu.cc", "csrc/common/packed_params.cc",
                  "csrc/cpu/packed_cpu.cc"]
ORT_FRONT_END = "csrc/ort/register.cc"
PACKED_FRONT_END = "csrc/ort/packed_ops.cc"
CPU_PROVIDERS = "csrc/ort/providers_cpu.cc"
GPU_PROVIDERS = "csrc/ort/providers_gpu.cc"
GPU_TEST_ENTRY = "csrc/cuda/test_entry.cu"
SIMD_SOURCE = "csrc/cpu/qdq_simd.cc"
SIMD_VARIANTS = ([(8, "-mavx2 -mf16c"), (16, "-mavx512f -mavx512bw -mavx512vl -mavx512dq")]
                 if platform.machine().lower() in ("x86_64", "amd64") else [])
# qdq_simd.cc is compiled in this many parts per width (-DMXOPS_SIMD_PART, run_walks there): its
# walkers take most of the build's time, and the parts compile in parallel.
SIMD_PARTS = 5


def _cpu_flags() -> set[str]:
    """This machine's processor flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def simd_variants() -> list[tuple[int, str]]:
    """The SIMD widths to build: both on x86-64; for the sanitizer build, which runs only here,
    the AVX-512 walkers only where this processor has AVX-512 (on the others they would never
    run, and they double the sanitizer build's time)."""
    if not SANITIZE or not SIMD_VARIANTS:
        return SIMD_VARIANTS
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    return [(w, f) for w, f in SIMD_VARIANTS if w == 8 or avx512 <= _cpu_flags()]


def _ninja_binary() -> str:
    try:
        import ninja  # the PyPI package carries the binary
        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("ninja")
    if not found:
        raise RuntimeError("ninja not found: pip install ninja")
    return found


def _find_hipcc() -> str | None:
    for candidate in (shutil.which("hipcc"), "/opt/rocm/bin/hipcc", "/usr/bin/hipcc"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _obj(src: str, variant: str) -> str:
    return f"obj/{variant}/" + src.replace("/", "_") + ".o"


def write_build_ninja(build_dir: Path, outputs: dict[str, Path], ort_include: Path,
                      nvcc: str | None, hipcc: str | None) -> None:
    """Writes build.ninja producing every entry of `outputs` (target name -> file)."""
    import pybind11

    py_include = sysconfig.get_paths()["include"]
    variants = simd_variants()
    # (qdq_cpu.cc leaves out the AVX-512 path where simd_variants() leaves out its walkers)
    skipped = "-DMXOPS_NO_SIMD16" if len(variants) < len(SIMD_VARIANTS) else ""
    lines = [
        f"root = {ROOT}",
        f"cxxflags = {CXXFLAGS} {SANITIZE_FLAGS if SANITIZE else ''} {skipped} -I$root/csrc",
        f"ortinc = -isystem {ort_include}",
        f"pyinc = -isystem {py_include} -isystem {pybind11.get_include()}",
        "rule cxx",
        "  command = c++ $cxxflags $extra -MMD -MF $out.d -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "rule link",
        "  command = c++ -shared $in -o $out $ldflags",
    ]
    build = []

    def compile_cxx(src: str, variant: str, extra: str = "") -> str:
        obj = _obj(src, variant)
        build.append(f"build {obj}: cxx $root/{src}\n  extra = {extra}")
        return obj

    cpu_objs = [compile_cxx(s, "cpu") for s in COMMON_SOURCES]
    # SIMD walkers of the CPU kernels: objects per instruction set, chosen at run time
    # (csrc/cpu/qdq_simd.h); never -march=native.
    cpu_objs += [compile_cxx(SIMD_SOURCE, f"cpu_simd{width}_{part}",
                             f"{flags} -DMXOPS_SIMD_WIDTH={width} -DMXOPS_SIMD_PART={part}")
                 for width, flags in variants for part in range(SIMD_PARTS)]
    front_end = [compile_cxx(src, "cpu", "$ortinc") for src in (ORT_FRONT_END, PACKED_FRONT_END)]
    reg_cpu = front_end + [compile_cxx(CPU_PROVIDERS, "cpu", "$ortinc")]
    build.append(f"build {outputs['cpu']}: link {' '.join(cpu_objs + reg_cpu)}\n" + (
        f"  ldflags = {SANITIZE_FLAGS}" if SANITIZE else
        "  ldflags = -Wl,--exclude-libs,ALL -static-libstdc++ -static-libgcc"))
    native = compile_cxx("csrc/python/native_module.cc", "cpu", "$pyinc")
    build.append(f"build {outputs['native']}: link {' '.join(cpu_objs + [native])}\n"
                 "  ldflags = -pthread")

    gpu_sources = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("csrc/cuda/*.cu")
                         if p.relative_to(ROOT).as_posix() != GPU_TEST_ENTRY)

    def gpu_backend(variant: str, compile_command: str, link_command: str) -> None:
        """The same GPU sources through one toolchain, linked with the CPU kernels and the
        ORT front end registering both providers; and the test library (the kernels and the
        C entry points of test_entry.cu, no ORT front end)."""
        lines.extend([f"rule {variant}_cc",
                      f"  command = {compile_command} -MD -MF $out.d -c $in -o $out",
                      "  depfile = $out.d", "  deps = gcc",
                      f"rule {variant}_link", f"  command = {link_command} $in -o $out"])
        objs = []
        for src in gpu_sources:
            objs.append(_obj(src, variant))
            build.append(f"build {objs[-1]}: {variant}_cc $root/{src}")
        providers = compile_cxx(GPU_PROVIDERS, variant, "$ortinc")
        build.append(f"build {outputs[variant]}: {variant}_link "
                     f"{' '.join(cpu_objs + front_end + objs + [providers])}")
        test_obj = _obj(GPU_TEST_ENTRY, variant)
        build.append(f"build {test_obj}: {variant}_cc $root/{GPU_TEST_ENTRY}")
        build.append(f"build {outputs[variant + '_tests']}: {variant}_link "
                     f"{' '.join([cpu_objs[0]] + objs + [test_obj])}")

    if nvcc and "cuda" in outputs:
        archs = os.environ.get("MXOPS_CUDA_ARCHS", "80;90;100").split(";")
        gencode = " ".join(f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs)
        gencode += f" -gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"
        # --fmad=false: no FMA contraction, so the device rounds exactly as the host does.
        gpu_backend("cuda",
                    f"{nvcc} -std=c++17 -O3 --fmad=false -Xcompiler -fPIC,-fvisibility=hidden,"
                    f"-ffp-contract=off -I$root/csrc {gencode}",
                    f"{nvcc} -shared -cudart static -Xlinker --exclude-libs,ALL -Xlinker --no-undefined")

    if hipcc and "rocm" in outputs:
        archs = os.environ.get("MXOPS_ROCM_ARCHS", "gfx90a;gfx908;gfx1030").split(";")
        offload = " ".join(f"--offload-arch={a}" for a in archs)
        gpu_backend("rocm",
                    f"HIP_PLATFORM=amd {hipcc} -x hip -std=c++17 -O3 -fPIC -fvisibility=hidden "
                    f"-ffp-contract=off -I$root/csrc {offload}",
                    f"HIP_PLATFORM=amd {hipcc} -shared -fPIC -Wl,--no-undefined {offload}")

    (build_dir / "build.ninja").write_text("\n".join(lines + build) + "\n")


class NinjaBuildExt(build_ext):
    """Builds every native artefact with one ninja run and places them in the package."""

    def run(self) -> None:
        build_dir = Path(self.build_temp).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        native_path = Path(self.get_ext_fullpath("ort_mx_ops._native")).resolve()
        package_dir = native_path.parent
        package_dir.mkdir(parents=True, exist_ok=True)
        outputs = {"cpu": "libort_mx_ops_cpu.so", "native": native_path.name}
        if SANITIZE:
            widths = ", ".join(str(w) for w, _ in simd_variants()) or "none"
            announce("MXOPS_SANITIZE: building the CPU library with -fsanitize=address,undefined "
                     f"into {SANITIZE_DIR} (not installed); SIMD widths {widths} (those this "
                     "processor runs)")
            write_build_ninja(build_dir, outputs, find_ort_headers(build_dir), None, None)
            jobs = os.environ.get("MXOPS_BUILD_JOBS", str(os.cpu_count() or 2))
            subprocess.run([_ninja_binary(), "-C", str(build_dir), "-j", jobs, outputs["cpu"]],
                           check=True)
            SANITIZE_DIR.mkdir(parents=True, exist_ok=True)
            shutil.copy2(build_dir / outputs["cpu"], SANITIZE_DIR / outputs["cpu"])
            log(f"sanitized CPU library: {SANITIZE_DIR / outputs['cpu']}")
            return

        nvcc = None if os.environ.get("MXOPS_NO_CUDA") else shutil.which("nvcc")
        hipcc = None if os.environ.get("MXOPS_NO_ROCM") else _find_hipcc()
        have_cuda_sources = any(ROOT.glob("csrc/cuda/*.cu"))
        plan = ["CPU"]
        if nvcc and have_cuda_sources:
            outputs["cuda"] = "libort_mx_ops_cuda.so"
            outputs["cuda_tests"] = "libort_mx_ops_cuda_tests.so"
            plan.append(f"CUDA (nvcc {nvcc}; several minutes; skip with MXOPS_NO_CUDA=1)")
        else:
            why = "MXOPS_NO_CUDA set" if os.environ.get("MXOPS_NO_CUDA") else "nvcc not found"
            log(f"CUDA backend skipped: {why}")
        if hipcc and have_cuda_sources:
            outputs["rocm"] = "libort_mx_ops_rocm.so"
            outputs["rocm_tests"] = "libort_mx_ops_rocm_tests.so"
            plan.append(f"ROCm (hipcc {hipcc}, HIP_PLATFORM=amd; several minutes; "
                        "skip with MXOPS_NO_ROCM=1)")
        else:
            why = "MXOPS_NO_ROCM set" if os.environ.get("MXOPS_NO_ROCM") else "hipcc not found"
            log(f"ROCm backend skipped: {why}")
        announce("building the custom-op libraries: " + "; ".join(plan))

        ort_include = find_ort_headers(build_dir)
        write_build_ninja(build_dir, outputs, ort_include, nvcc, hipcc)
        jobs = os.environ.get("MXOPS_BUILD_JOBS", str(os.cpu_count() or 2))
        ninja = [_ninja_binary(), "-C", str(build_dir), "-j", jobs]
        # The CPU library and the module first: a GPU backend that fails to build must not
        # cost the CPU install (tests/test_gpu_build.py fails where a toolkit was present).
        subprocess.run(ninja + [outputs["cpu"], outputs["native"]], check=True)
        built = ["cpu", "native"]
        for backend in ("cuda", "rocm"):
            if backend in outputs:
                announce(f"building the {backend.upper()} library (skip with "
                         f"MXOPS_NO_{backend.upper()}=1)")
                tests = outputs[backend + "_tests"]
                if subprocess.run(ninja + [outputs[backend], tests]).returncode == 0:
                    built.append(backend)
                    GPU_TEST_DIR.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(build_dir / tests, GPU_TEST_DIR / tests)
                    log(f"test library (not installed): {GPU_TEST_DIR / tests}")
                else:
                    log(f"WARNING: the {backend.upper()} backend failed to build (see above); "
                        "installing without it")
        for key in built:
            shutil.copy2(build_dir / outputs[key], package_dir / outputs[key])
            log(f"installed {package_dir / outputs[key]}")


setup(
    packages=["ort_mx_ops", "ort_mx_ops.quantizer", "ort_mx_ops.benchmarks"],
    package_dir={"ort_mx_ops": "ort_mx_ops", "ort_mx_ops.quantizer": "quantizer",
                 "ort_mx_ops.benchmarks": "benchmarks"},
    ext_modules=[Extension("ort_mx_ops._native", sources=[])],
    cmdclass={"build_ext": NinjaBuildExt},
)
