//===- UniqueJson.h - JSON parsing that refuses repeated keys ---------------===//
//
// nlohmann::json::parse keeps the last of a key repeated within one object, silently: a config.json or a batch
// line with "hidden_size" or "src" twice was read as whichever came last. parseUniqueJson parses the same text
// and throws DuplicateJsonKey naming the key and where it is (the object's path, JSON-pointer style).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <nlohmann/json.hpp>

#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace lmcc {

struct DuplicateJsonKey : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Json::parse(input) (a string or a stream; its exceptions for invalid JSON), refusing a key that appears twice in
/// one object.
template <typename Json = nlohmann::json, typename Input> Json parseUniqueJson(Input &&input) {
  struct Level {
    bool object;
    std::set<std::string> keys;
    std::string name; ///< this value's key or index in its parent
    size_t next = 0;  ///< arrays: the next element's index
  };
  std::vector<Level> stack;
  std::string lastKey, duplicate, where;
  auto path = [&] {
    std::string p;
    for (size_t i = 1; i < stack.size(); ++i)
      p += "/" + stack[i].name;
    return p.empty() ? std::string("/") : p;
  };
  auto childName = [&]() -> std::string {
    if (stack.empty())
      return "";
    Level &parent = stack.back();
    return parent.object ? lastKey : std::to_string(parent.next++);
  };
  typename Json::parser_callback_t onEvent = [&](int, typename Json::parse_event_t event, Json &parsed) {
    using E = typename Json::parse_event_t;
    switch (event) {
    case E::object_start:
    case E::array_start: {
      std::string name = childName();
      stack.push_back({event == E::object_start, {}, std::move(name)});
      break;
    }
    case E::object_end:
    case E::array_end:
      stack.pop_back();
      break;
    case E::key:
      lastKey = parsed.template get<std::string>();
      if (duplicate.empty() && !stack.back().keys.insert(lastKey).second)
        duplicate = lastKey, where = path();
      break;
    case E::value:
      if (!stack.empty() && !stack.back().object)
        ++stack.back().next;
      break;
    }
    return true;
  };
  // nlohmann's lexer ends the input at a NUL byte, so `{...}\0 garbage` parsed as `{...}`: JSON text has no NUL.
  auto nulByte = [](size_t at) {
    return Json::parse_error::create(101, at, "syntax error: a NUL byte (JSON text has none)", nullptr);
  };
  Json j;
  if constexpr (std::is_convertible_v<Input, std::string_view>) {
    const std::string_view text(input);
    if (const size_t at = text.find('\0'); at != std::string_view::npos)
      throw nulByte(at + 1);
    j = Json::parse(text, onEvent);
  } else {
    j = Json::parse(input, onEvent);
    if (input.peek() != std::char_traits<char>::eof()) // stopped at a NUL before the end
      throw nulByte(size_t(input.tellg()));
  }
  if (!duplicate.empty())
    throw DuplicateJsonKey("key \"" + duplicate + "\" appears twice in the object at " + where);
  return j;
}

} // namespace lmcc
