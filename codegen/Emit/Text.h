//===- Text.h - Text pieces shared by the generated header and glue ---------===//
//
// Internal to codegen/Emit: name checks, C string literals and the @name@ templates of Header.cpp and Glue.cpp.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>

namespace lmcc::codegen::text {

/// The name in upper case (<NAME>_* macros).
std::string upper(const std::string &s);

/// Checks that the generated symbols are valid and do not collide with the runtime's; throws
/// std::invalid_argument otherwise.
void checkName(const std::string &name);

/// The C++ namespace of the wrappers: the model name, or std_ for a model named std (lmcc check refuses C and C++
/// keywords as names: frontend/Spec.cpp, reservedNameReason).
std::string cppNamespace(const std::string &name);

/// A C string literal.
std::string cString(const std::string &s);

/// Replaces every "@name@" / "@NAME@" / "@ns@" in a template, and "@ABI@" with the runtime ABI version
/// (LM_ABI_VERSION, runtime/lib/lmrt.h) the generated code is for.
std::string expand(std::string text, const std::string &name, const std::string &ns);

} // namespace lmcc::codegen::text
