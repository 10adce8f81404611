# lit configuration: IR tests (*.mlir) and command-line tests (*.test).
import os
import lit.formats

config.name = "lmcc"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.join(config.lmcc_src_dir, "tests")
config.test_exec_root = os.path.join(config.lmcc_bin_dir, "..", "tests")
config.excludes = ["unit", "golden", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py.in", "README.md"]
config.environment["PATH"] = os.pathsep.join([config.lmcc_bin_dir, os.path.join(config.lmcc_bin_dir, "..", "bench"),
                                              os.path.dirname(config.filecheck),
                                              config.environment.get("PATH", "")])
config.substitutions.append(("%models", os.path.join(config.lmcc_src_dir, "models")))
config.substitutions.append(("%inputs", os.path.join(config.lmcc_src_dir, "tests", "inputs")))
# Compiled libraries that `lmcc score`/`embed` cache, kept inside the build tree.
config.environment["LMCC_CACHE_DIR"] = os.path.join(config.lmcc_bin_dir, "..", "tests", "lmcc-cache")
# The evaluation data beside the project (../shared/data: STS-B, BLiMP, the T-TA vocabulary): tests that read it
# (cli/eval-data.test) say REQUIRES: shared-data and are reported UNSUPPORTED where it is missing.
shared_data = os.path.join(config.lmcc_src_dir, "..", "shared", "data")
if os.path.isdir(os.path.join(shared_data, "stsb")) and os.path.isdir(os.path.join(shared_data, "blimp")):
    config.available_features.add("shared-data")
config.substitutions.append(("%shared", shared_data))
# A CPU with AMX-BF16 (and Linux, which reports it): tests of the bf16 AMX kernel on real tiles (cli/gemm_ab-amx.test)
# say REQUIRES: amx and are reported UNSUPPORTED elsewhere.
try:
    with open("/proc/cpuinfo") as cpuinfo:
        flags = set(cpuinfo.read().split())
    if {"amx_tile", "amx_bf16", "avx512_bf16", "avx512f"} <= flags:
        config.available_features.add("amx")
except OSError:
    pass
# A full disk on demand: a small tmpfs mounted in a private mount namespace (root, util-linux's unshare). Tests
# of what a write failing with ENOSPC leaves behind (cli/disk-full.test) say REQUIRES: tmpfs-mount and are
# reported UNSUPPORTED where mounting is not allowed.
import subprocess
try:
    if subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10).returncode == 0:
        config.available_features.add("tmpfs-mount")
except (OSError, subprocess.SubprocessError):
    pass
