//===- TestPaths.h - Where the unit tests find the checkout and the runtime ---===//
//
// Defined in the build tree's generated TestPaths.cpp (tests/CMakeLists.txt), the only object that names
// this clone's directories: the test sources compile the same in every checkout, so a fresh clone's build
// hits the compiler cache that another clone filled (CI).
//
//===----------------------------------------------------------------------===//
#pragma once

namespace lmcc::test {

extern const char *const kSourceDir;  ///< the checkout (PROJECT_SOURCE_DIR): fixtures, models, examples
extern const char *const kRuntimeDir; ///< the directory liblmrt.so and lmrt.h are built into

} // namespace lmcc::test
