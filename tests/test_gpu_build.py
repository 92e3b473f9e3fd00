"""The GPU libraries as built (CI, no GPU needed): where nvcc / hipcc was present at install
time, the CUDA / ROCm library exists, exports RegisterCustomOps and the C test entry points,
and carries device code for every target it was built for. Inspected from the ELF files
themselves (dynamic symbol table, offload bundle), so no GPU, driver or runtime is needed.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import ort_mx_ops

import gpu_cases

EXPORTS = ("RegisterCustomOps",)
TEST_EXPORTS = ("mxops_gpu_qdq", "mxops_gpu_bf16_qdq", "mxops_gpu_execution_provider")
CUDA_ARCHS = os.environ.get("MXOPS_CUDA_ARCHS", "80;90;100").split(";")
ROCM_ARCHS = os.environ.get("MXOPS_ROCM_ARCHS", "gfx90a;gfx908;gfx1030").split(";")
# e_flags & EF_AMDGPU_MACH of an AMDGPU code object, per target (LLVM's ELF.h).
AMDGPU_MACH = {"gfx900": 0x2c, "gfx906": 0x2f, "gfx908": 0x30, "gfx90a": 0x3f, "gfx1010": 0x33,
               "gfx1030": 0x36, "gfx1100": 0x41}
EM_AMDGPU = 224
# Kernels every device code object must contain (by name, as in csrc/cuda).
# Kernel names as they appear in the (mangled) device symbols; the BF16 kernel is one template
# instantiated once per direction, so each instantiation is looked for.
KERNELS = (b"contiguous_cached_kernel", b"contiguous_long_kernel", b"strided_kernel",
           b"bf16_linear_kernelINS1_19Bf16QuantizeElement",
           b"bf16_linear_kernelINS1_21Bf16DequantizeElement", b"identity_kernel")


# ------------------------------------------------------------------------------------------
# A minimal ELF64 reader: sections and the dynamic symbol table
# ------------------------------------------------------------------------------------------

def elf_sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (type, offset, size) of every section of a little-endian ELF64 image."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 LE file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3a)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
               for i in range(shnum)]
    strtab_off, strtab_size = headers[shstrndx][4], headers[shstrndx][5]
    strtab = data[strtab_off:strtab_off + strtab_size]
    out = {}
    for h in headers:
        name = strtab[h[0]:strtab.index(b"\0", h[0])].decode()
        out[name] = (h[1], h[4], h[5])
    return out


def exported_functions(path: str) -> set[str]:
    """Names of the defined, global, default-visibility symbols in .dynsym."""
    data = Path(path).read_bytes()
    sec = elf_sections(data)
    _, sym_off, sym_size = sec[".dynsym"]
    _, str_off, str_size = sec[".dynstr"]
    names = data[str_off:str_off + str_size]
    out = set()
    for i in range(sym_size // 24):
        st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", data, sym_off + 24 * i)
        if st_shndx != 0 and (st_info >> 4) in (1, 2) and (st_other & 3) in (0, 3):
            out.add(names[st_name:names.index(b"\0", st_name)].decode())
    return out


def offload_bundles(blob: bytes) -> list[dict[str, bytes]]:
    """The clang offload bundles in a .hip_fatbin section: one {target id: code object}
    dictionary per bundle (each translation unit contributes one)."""
    magic = b"__CLANG_OFFLOAD_BUNDLE__"
    bundles = []
    start = blob.find(magic)
    while start >= 0:
        count, = struct.unpack_from("<Q", blob, start + len(magic))
        pos = start + len(magic) + 8
        entries = {}
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", blob, pos)
            pos += 24
            target = blob[pos:pos + id_len].decode()
            pos += id_len
            entries[target] = blob[start + offset:start + offset + size]
        bundles.append(entries)
        start = blob.find(magic, pos)
    return bundles


# ------------------------------------------------------------------------------------------
# CUDA
# ------------------------------------------------------------------------------------------

def _library(device: str, tool: str | None, toolkit: str) -> str:
    if tool is None:
        pytest.skip(f"{toolkit} not found on this machine: the {device} backend is not built")
    try:
        return ort_mx_ops.get_library_path(device)
    except FileNotFoundError as e:
        pytest.fail(f"{toolkit} is present but the {device} library is missing "
                    f"(the build failed or was skipped; reinstall and read the build log): {e}")


@pytest.fixture(scope="module")
def cuda_library() -> str:
    return _library("CUDA", shutil.which("nvcc"), "nvcc")


@pytest.fixture(scope="module")
def rocm_library() -> str:
    hipcc = shutil.which("hipcc") or next(
        (p for p in ("/opt/rocm/bin/hipcc", "/usr/bin/hipcc") if os.path.exists(p)), None)
    return _library("ROCM", hipcc, "hipcc")


def check_exports(library: str, backend: str) -> None:
    """The released library exports RegisterCustomOps and none of the test entry points;
    the test library beside it exports those."""
    exported = exported_functions(library)
    assert set(EXPORTS) <= exported, f"{library} does not export {sorted(set(EXPORTS) - exported)}"
    leaked = set(TEST_EXPORTS) & exported
    assert not leaked, f"{library} exports test entry points {sorted(leaked)}"
    tests = gpu_cases.test_library_path(backend)
    assert tests.exists(), f"the {backend} test library {tests} was not built"
    missing = set(TEST_EXPORTS) - exported_functions(str(tests))
    assert not missing, f"{tests} does not export {sorted(missing)}"


def test_cuda_library_exports(cuda_library):
    check_exports(cuda_library, "CUDA")


def fatbin_entries(blob: bytes) -> list[tuple[str, int, bytes]]:
    """(kind "elf" | "ptx", SM arch, payload) of every entry of the CUDA fat binaries in a
    .nv_fatbin section (one fat binary per translation unit). Payloads may be compressed."""
    out = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != 0xBA55ED50:
            pos += 8  # fat binaries are 8-byte aligned
            continue
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry < end:
            kind, _, entry_header, size = struct.unpack_from("<HHIQ", blob, entry)
            arch, = struct.unpack_from("<I", blob, entry + 28)
            payload = blob[entry + entry_header:entry + entry_header + size]
            out.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), arch, payload))
            entry += entry_header + size
        pos = end
    return out


def test_cuda_library_carries_every_arch(cuda_library):
    data = Path(cuda_library).read_bytes()
    sections = elf_sections(data)
    assert ".nv_fatbin" in sections, f"{cuda_library} has no device code (.nv_fatbin)"
    _, off, size = sections[".nv_fatbin"]
    entries = fatbin_entries(data[off:off + size])
    assert entries, "the .nv_fatbin section holds no fat binary"
    for arch in map(int, CUDA_ARCHS):
        cubins = [p for kind, a, p in entries if kind == "elf" and a == arch]
        assert cubins, f"no sm_{arch} code: entries {[(k, a) for k, a, _ in entries]}"
        plain = [p for p in cubins if p[:4] == b"\x7fELF"]
        if plain:  # uncompressed cubins: every kernel is there
            found = {k for k in KERNELS if any(k in p for p in plain)}
            assert found == set(KERNELS), f"sm_{arch}: kernels missing {set(KERNELS) - found}"
    last = int(CUDA_ARCHS[-1])
    assert any(kind == "ptx" and a == last for kind, a, _ in entries), \
        f"no compute_{last} PTX for newer GPUs"


# ------------------------------------------------------------------------------------------
# ROCm
# ------------------------------------------------------------------------------------------

def test_rocm_library_exports(rocm_library):
    check_exports(rocm_library, "ROCM")


def test_rocm_library_carries_device_code_for_every_target(rocm_library):
    data = Path(rocm_library).read_bytes()
    sections = elf_sections(data)
    assert ".hip_fatbin" in sections, f"{rocm_library} has no .hip_fatbin section"
    _, off, size = sections[".hip_fatbin"]
    bundles = offload_bundles(data[off:off + size])
    assert bundles, "the .hip_fatbin section holds no offload bundle"
    found_kernels = {arch: set() for arch in ROCM_ARCHS}
    for bundle in bundles:
        for arch in ROCM_ARCHS:
            ids = [t for t in bundle
                   if t.startswith("hip") and t.split("--")[-1].split(":")[0] == arch]
            assert ids, f"a bundle lacks {arch}: it has {sorted(bundle)}"
            code = bundle[ids[0]]
            assert code[:4] == b"\x7fELF", f"the {arch} entry is not a code object"
            e_machine, = struct.unpack_from("<H", code, 0x12)
            e_flags, = struct.unpack_from("<I", code, 0x30)
            assert e_machine == EM_AMDGPU, f"the {arch} code object is not AMDGPU"
            if arch in AMDGPU_MACH:
                assert e_flags & 0xff == AMDGPU_MACH[arch], \
                    f"the {arch} code object is for machine {e_flags & 0xff:#x}"
            found_kernels[arch] |= {k for k in KERNELS if k in code}
    for arch, kernels in found_kernels.items():
        assert kernels == set(KERNELS), f"{arch}: kernels missing {set(KERNELS) - kernels}"


def test_rocm_bundle_listing_agrees(rocm_library):
    """clang-offload-bundler, where present, lists the same targets (HIP 5.x names them
    hipv4-amdgcn-amd-amdhsa--<gfx>)."""
    bundler = shutil.which("clang-offload-bundler") or next(
        (str(p) for p in sorted(Path("/usr/lib").glob("llvm-*/bin/clang-offload-bundler"))), None)
    if bundler is None:
        pytest.skip("clang-offload-bundler not found")
    data = Path(rocm_library).read_bytes()
    _, off, size = elf_sections(data)[".hip_fatbin"]
    blob = data[off:off + size]
    first = blob.find(b"__CLANG_OFFLOAD_BUNDLE__")
    second = blob.find(b"__CLANG_OFFLOAD_BUNDLE__", first + 1)
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".hipfb") as f:
        f.write(blob[first:second if second > 0 else len(blob)])
        f.flush()
        listed = subprocess.run([bundler, "--list", "--type=o", f"--input={f.name}"],
                                capture_output=True, text=True).stdout.split()
    for arch in ROCM_ARCHS:
        assert any(t.endswith("--" + arch) or f"--{arch}:" in t for t in listed), \
            f"{arch} not listed by clang-offload-bundler: {listed}"
