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
