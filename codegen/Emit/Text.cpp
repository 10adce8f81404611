//===- Text.cpp - Text pieces shared by the generated header and glue -------===//
//===----------------------------------------------------------------------===//
#include "codegen/Emit/Text.h"
#include "runtime/lib/lmrt.h" // LM_ABI_VERSION

#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace lmcc::codegen::text {

namespace {

bool isCIdentifier(const std::string &s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
    return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
      return false;
  return true;
}

} // namespace

std::string upper(const std::string &s) {
  std::string out = s;
  for (char &c : out)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

void checkName(const std::string &name) {
  if (!isCIdentifier(name))
    throw std::invalid_argument("model name '" + name + "' is not a C identifier");
  // <name>_load/_score/_embed/_free would be the runtime's lm_rt_load/... themselves.
  if (name == "lm_rt")
    throw std::invalid_argument("model name 'lm_rt' collides with the runtime's lm_rt_* functions");
}

std::string cppNamespace(const std::string &name) { return name == "std" ? "std_" : name; }

std::string cString(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f || c == '?') { // '?' avoids trigraphs
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\%03o", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string expand(std::string text, const std::string &name, const std::string &ns) {
  const std::pair<std::string, std::string> subs[] = {
      {"@name@", name}, {"@NAME@", upper(name)}, {"@ns@", ns}, {"@ABI@", std::to_string(LM_ABI_VERSION)}};
  for (const auto &[from, to] : subs)
    for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size()))
      text.replace(pos, from.size(), to);
  return text;
}

} // namespace lmcc::codegen::text
