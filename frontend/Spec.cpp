//===- Spec.cpp - Parse and validate model specs (TOML, toml++) -------------===//
//
// The schema is a contract (see README.md, "Model specs"). Every error names
// `file:line:column`, the field, and what would be valid. Unknown keys are errors
// so that typos never silently fall back to defaults.
//
//===----------------------------------------------------------------------===//
#include "frontend/Spec.h"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <set>
#include <sstream>

#include <unistd.h>

namespace lmcc {
namespace {

template <typename E> struct EnumName {
  const char *name;
  E value;
};

const EnumName<Family> kFamilies[] = {{"unilm", Family::UniLM},
                                      {"bilm", Family::BiLM},
                                      {"tta", Family::TTA},
                                      {"ngram", Family::NGram},
                                      {"diformer", Family::Diformer}};
const EnumName<PositionKind> kPositions[] = {
    {"learned", PositionKind::Learned}, {"sinusoidal", PositionKind::Sinusoidal}, {"none", PositionKind::None}};
const EnumName<MaskKind> kMasks[] = {{"none", MaskKind::None},
                                     {"causal", MaskKind::Causal},
                                     {"anticausal", MaskKind::Anticausal},
                                     {"diagonal", MaskKind::Diagonal},
                                     {"directional", MaskKind::Directional}};
const EnumName<KeyValueSource> kKeyValues[] = {{"hidden", KeyValueSource::Hidden},
                                               {"embedding", KeyValueSource::Embedding}};
const EnumName<FirstQuery> kFirstQueries[] = {{"embedding", FirstQuery::Embedding},
                                              {"position", FirstQuery::Position},
                                              {"mask+position", FirstQuery::MaskPosition}};
const EnumName<Activation> kActivations[] = {
    {"gelu", Activation::Gelu}, {"gelu_tanh", Activation::GeluTanh}, {"relu", Activation::Relu}};
const EnumName<NormPlacement> kNorms[] = {{"post", NormPlacement::Post}, {"pre", NormPlacement::Pre}};
const EnumName<ScoreMethod> kMethods[] = {{"causal", ScoreMethod::Causal},
                                          {"mask-and-predict", ScoreMethod::MaskAndPredict},
                                          {"single-pass", ScoreMethod::SinglePass}};

const EnumName<Objective> kObjectives[] = {{"auto", Objective::Auto},
                                           {"causal", Objective::Causal},
                                           {"masked", Objective::Masked},
                                           {"autoencoding", Objective::Autoencoding},
                                           {"directional", Objective::Directional},
                                           {"ngram", Objective::NGram}};
const EnumName<OptimizerKind> kOptimizers[] = {
    {"adamw", OptimizerKind::AdamW}, {"adam", OptimizerKind::Adam}, {"sgd", OptimizerKind::SGD}};
const EnumName<Schedule> kSchedules[] = {
    {"linear", Schedule::Linear}, {"constant", Schedule::Constant}, {"cosine", Schedule::Cosine}};
const EnumName<MaskReplace> kMaskReplaces[] = {{"mask", MaskReplace::Mask}, {"bert", MaskReplace::Bert}};
const EnumName<Pooling> kPoolings[] = {
    {"mean", Pooling::Mean}, {"mean_all", Pooling::MeanAll}, {"cls", Pooling::Cls}};

template <typename E, size_t N> const char *nameOf(const EnumName<E> (&table)[N], E value) {
  for (const auto &entry : table)
    if (entry.value == value)
      return entry.name;
  return "?";
}

template <typename E, size_t N> std::string choices(const EnumName<E> (&table)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += (i ? ", \"" : "\"") + std::string(table[i].name) + "\"";
  return out;
}

/// Reads typed fields out of one TOML table, remembering which keys were used.
class Reader {
public:
  Reader(std::string path) : path(std::move(path)) {}

  std::string at(const toml::source_region &region) const {
    if (!region.begin)
      return path;
    return path + ":" + std::to_string(region.begin.line) + ":" + std::to_string(region.begin.column);
  }
  std::string at(const toml::node &node) const { return at(node.source()); }

  [[noreturn]] void fail(const std::string &where, const std::string &field, const std::string &what) const {
    throw SpecError(where, field, what);
  }

  /// Rejects keys of `table` not in `allowed`.
  void onlyKeys(const toml::table &table, const std::string &prefix, const std::set<std::string> &allowed) const {
    for (auto &&[key, node] : table) {
      std::string k(key.str());
      if (allowed.count(k))
        continue;
      std::string valid;
      for (const auto &a : allowed)
        valid += (valid.empty() ? "" : ", ") + a;
      fail(at(key.source()), prefix + k, "unknown key; valid keys here are: " + valid);
    }
  }

  const toml::table *subTable(const toml::table &root, const std::string &key) const {
    const toml::node *node = root.get(key);
    if (!node)
      return nullptr;
    if (!node->is_table())
      fail(at(*node), key, "expected a table [" + key + "]");
    return node->as_table();
  }

  void readInt(const toml::table *t, const std::string &prefix, const char *key, int64_t &out) const {
    if (const toml::node *n = t ? t->get(key) : nullptr) {
      if (!n->is_integer())
        fail(at(*n), prefix + key, std::string("expected an integer, got ") + typeName(*n));
      out = n->as_integer()->get();
    }
  }
  void readBool(const toml::table *t, const std::string &prefix, const char *key, bool &out) const {
    if (const toml::node *n = t ? t->get(key) : nullptr) {
      if (!n->is_boolean())
        fail(at(*n), prefix + key, std::string("expected true or false, got ") + typeName(*n));
      out = n->as_boolean()->get();
    }
  }
  void readString(const toml::table *t, const std::string &prefix, const char *key, std::string &out) const {
    if (const toml::node *n = t ? t->get(key) : nullptr) {
      if (!n->is_string())
        fail(at(*n), prefix + key, std::string("expected a string, got ") + typeName(*n));
      out = n->as_string()->get();
      if (out.empty())
        fail(at(*n), prefix + key, "must not be empty");
    }
  }
  void readFloat(const toml::table *t, const std::string &prefix, const char *key, double &out) const {
    if (const toml::node *n = t ? t->get(key) : nullptr) {
      if (n->is_integer())
        out = double(n->as_integer()->get());
      else if (n->is_floating_point())
        out = n->as_floating_point()->get();
      else
        fail(at(*n), prefix + key, std::string("expected a number, got ") + typeName(*n));
    }
  }
  template <typename E, size_t N>
  void readEnum(const toml::table *t, const std::string &prefix, const char *key, const EnumName<E> (&table)[N],
                E &out) const {
    if (const toml::node *n = t ? t->get(key) : nullptr) {
      if (!n->is_string())
        fail(at(*n), prefix + key, std::string("expected a string, one of ") + choices(table) + ", got " + typeName(*n));
      const std::string &value = n->as_string()->get();
      for (const auto &entry : table)
        if (value == entry.name) {
          out = entry.value;
          return;
        }
      fail(at(*n), prefix + key, "unknown value \"" + value + "\"; valid values are " + choices(table));
    }
  }

  static const char *typeName(const toml::node &n) {
    switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
    }
  }

  std::string path;
};

/// Field positions kept for validation messages that come after parsing.
struct Positions {
  std::map<std::string, std::string> where; // field -> file:line:column
  std::string of(const std::string &field, const std::string &fallback) const {
    auto it = where.find(field);
    return it == where.end() ? fallback : it->second;
  }
};

void recordPositions(const Reader &r, const toml::table &table, const std::string &prefix, Positions &pos) {
  for (auto &&[key, node] : table) {
    std::string k = prefix + std::string(key.str());
    pos.where[k] = r.at(node);
    if (node.is_table())
      recordPositions(r, *node.as_table(), k + ".", pos);
  }
}

bool isCIdentifier(const std::string &s) {
  if (s.empty() || !(std::isalpha((unsigned char)s[0]) || s[0] == '_'))
    return false;
  for (char c : s)
    if (!(std::isalnum((unsigned char)c) || c == '_'))
      return false;
  return true;
}


/// Why `name` cannot name a library, a header and C symbols, or "" when it can: it would collide with the
/// runtime (liblmrt, the lm_ functions), a C/C++ keyword, a standard or POSIX header that DIR/<name>.h would
/// shadow, a predefined macro, or main.
std::string reservedNameReason(const std::string &name) {
  static const std::set<std::string> keywords = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
      "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
      "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
      "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
      "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
      "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
      "requires", "restrict", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast",
      "struct", "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid",
      "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq",
      "_Alignas", "_Alignof", "_Atomic", "_Bool", "_Complex", "_Generic", "_Imaginary", "_Noreturn",
      "_Static_assert", "_Thread_local"};
  static const std::set<std::string> headers = {
      // C17 and POSIX headers an application including DIR/<name>.h with -I DIR may also include.
      "assert", "complex", "ctype", "errno", "fenv", "float", "inttypes", "iso646", "limits", "locale", "math",
      "setjmp", "signal", "stdalign", "stdarg", "stdatomic", "stdbool", "stddef", "stdint", "stdio", "stdlib",
      "stdnoreturn", "string", "tgmath", "threads", "time", "uchar", "wchar", "wctype", "unistd", "fcntl", "dlfcn",
      "pthread", "sched", "semaphore", "strings", "dirent", "poll", "termios", "syslog", "regex", "glob", "pwd",
      "grp", "utime", "alloca", "malloc", "endian"};
  static const std::set<std::string> macros = {"linux", "unix", "i386", "i686", "x86_64", "amd64", "errno",
                                               "assert", "NULL", "EOF", "BUFSIZ", "main", "stdin", "stdout",
                                               "stderr", "environ", "LM_API", "LM_ABI_VERSION"};
  // lib<name>.so in DIR would be found by -L DIR for these system libraries (-lc, -lm, ...): the library's own
  // link and every application's would take it instead of the system's.
  // (Not "m": specs named m are common in tests; its library links, see driver/Compile.cpp.)
  static const std::set<std::string> libraries = {"c",      "dl",     "rt",  "pthread", "util",     "crypt",
                                                  "resolv", "gcc",    "gcc_s", "stdc++", "supc++",  "atomic",
                                                  "anl",    "nsl",    "mvec", "z",      "tbb",      "utf8proc",
                                                  "omp",    "gomp",   "BrokenLocale"};
  // The header's C++ part wraps the model in `namespace <name>`: a global type, function or object of the C or
  // POSIX library with that name (from any header an application includes beside it) is redeclared as a different
  // kind of entity and the application does not compile.
  static const std::set<std::string> globals = {
      "size_t", "ssize_t", "ptrdiff_t", "intptr_t", "uintptr_t", "intmax_t", "uintmax_t", "max_align_t", "nullptr_t",
      "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "wint_t", "FILE",
      "fpos_t", "va_list", "time_t", "clock_t", "timespec", "timeval", "tm", "div_t", "ldiv_t", "lldiv_t",
      "sig_atomic_t", "jmp_buf", "off_t", "pid_t", "mode_t", "std", "INT_MAX", "INT_MIN", "UINT_MAX", "LONG_MAX",
      "SIZE_MAX", "free", "malloc", "calloc", "realloc", "exit", "abort", "atexit", "printf", "fprintf", "sprintf",
      "snprintf", "scanf", "puts", "putchar", "getchar", "fopen", "fclose", "fread", "fwrite", "fflush", "perror",
      "memcpy", "memmove", "memset", "memcmp", "strlen", "strcpy", "strcmp", "strncmp", "strdup", "qsort",
      "bsearch", "atoi", "atof", "strtol", "abs", "labs", "rand", "srand", "getenv", "system", "clock", "sqrt",
      "exp", "log", "pow", "sin", "cos", "floor", "ceil", "fabs", "round", "open", "close", "read", "write",
      "sleep", "fork", "pipe", "dup", "kill", "raise", "select", "socket", "index"};
  if (globals.count(name))
    return "is a type, function or macro of the C or POSIX library; the header's C++ namespace of that name would "
           "not compile beside it";
  if (name == "lmrt" || name.rfind("lm_", 0) == 0 || name.rfind("lmrt_", 0) == 0)
    return "collides with the runtime (liblmrt.so, the lm_ and lmrt_ functions)";
  if (libraries.count(name))
    return "would name lib" + name + ".so, which shadows the system library -l" + name +
           " for the library's own link and for applications linking with -L DIR";
  if (keywords.count(name))
    return "is a C or C++ keyword";
  if (headers.count(name))
    return "would name a header <" + name + ".h> that shadows the standard or system header of that name";
  if (macros.count(name))
    return "is a predefined macro or a name the C runtime defines";
  if (name.size() >= 2 && name[0] == '_' && (std::isupper((unsigned char)name[1]) || name[1] == '_'))
    return "is reserved to the C implementation (leading underscore and a capital, or two underscores)";
  if (name.size() > 64)
    return "is longer than 64 characters";
  return "";
}

/// Bytes of the fp32 weights (embeddings, every layer, the head) of a spec, in double to stay exact enough
/// for any size; the same count `lmcc check` compares with the machine's memory.
double weightBytes(const ModelSpec &s) {
  const double d = double(s.dims.dModel);
  // A layer of self-attention (4 d^2), an FFN of width ff and the norms; a Diformer decoder layer adds
  // cross-attention (4 d^2 more).
  auto layer = [&](double ff, bool cross) { return (cross ? 8 : 4) * d * d + 2 * d * ff + 12 * d + ff; };
  double layers = double(s.dims.layers) * layer(double(s.dims.dFF), false);
  if (s.diformer)
    layers = double(s.diformer->encoder.layers) * layer(double(s.diformer->encoder.dFF), false) +
             double(s.diformer->decoder.layers) * layer(double(s.diformer->decoder.dFF), true) +
             3 * double(s.dims.maxLen) * d; // length head, the decoder's two position tables
  if (s.ngram) // n - 1 heads of in [h, d] and out [d, h]
    layers += double(s.ngram->n - 1) * 2 * d * double(s.ngram->hiddenWidth(s.dims.dModel));
  return 4 * (double(s.dims.vocab) * d + double(s.dims.maxLen) * d + layers + d * d + 4 * d + double(s.dims.vocab));
}

void validate(const ModelSpec &s, const Positions &pos, const Reader &r) {
  auto where = [&](const std::string &field) { return pos.of(field, r.path); };
  auto fail = [&](const std::string &field, const std::string &what) { r.fail(where(field), field, what); };
  // A clash of two fields: reported at `field`, or at `other` when only that one is written in the file (the
  // other side is a family default), so that the message points at what the user can change.
  auto failEither = [&](const std::string &field, const std::string &other, const std::string &what) {
    const bool given = where(field) != r.path, otherGiven = where(other) != r.path;
    fail(!given && otherGiven ? other : field, what);
  };

  if (!isCIdentifier(s.name))
    fail("name", "\"" + s.name + "\" is not a C identifier (letters, digits and '_', not starting with a digit); "
                 "the library and header are named after it");
  if (std::string why = reservedNameReason(s.name); !why.empty())
    fail("name", "\"" + s.name + "\" " + why + "; the library, header and C symbols are named after it");
  const std::pair<const char *, int64_t> dims[] = {{"dims.vocab", s.dims.vocab},   {"dims.max_len", s.dims.maxLen},
                                                   {"dims.d_model", s.dims.dModel}, {"dims.heads", s.dims.heads},
                                                   {"dims.d_ff", s.dims.dFF},       {"dims.layers", s.dims.layers}};
  for (auto [field, value] : dims)
    if (value < 1 || value >= (int64_t(1) << 31))
      fail(field, "must be a positive integer below 2^31, got " + std::to_string(value));
  // Sizes lmcc can build: the IR has ops per layer and the kernels index with 32-bit lengths.
  auto atMost = [&](const std::string &field, int64_t value, int64_t most, const std::string &unit) {
    if (value > most)
      fail(field, "at most " + std::to_string(most) + unit + ", got " + std::to_string(value));
  };
  atMost("dims.layers", s.dims.layers, 1024, " layers");
  if (s.dims.maxLen > 65536)
    fail("dims.max_len", "at most 65536 positions, got " + std::to_string(s.dims.maxLen));
  if (s.dims.dModel > 65536 || s.dims.dFF > 1048576)
    fail(s.dims.dModel > 65536 ? "dims.d_model" : "dims.d_ff",
         "d_model at most 65536 and d_ff at most 1048576, got " + std::to_string(s.dims.dModel) + " and " +
             std::to_string(s.dims.dFF));
  // The same limits for the Diformer's stacks and the n-gram heads (issue 21: `check` accepts nothing that breaks
  // later).
  if (s.diformer)
    for (auto [name, d] : {std::pair<std::string, const StackDims *>{"encoder", &s.diformer->encoder},
                           {"decoder", &s.diformer->decoder}}) {
      atMost(name + ".layers", d->layers, 1024, " layers");
      if (d->heads >= (int64_t(1) << 31))
        fail(name + ".heads", "must be a positive integer below 2^31, got " + std::to_string(d->heads));
      atMost(name + ".d_ff", d->dFF, 1048576, "");
    }
  if (s.ngram) {
    atMost("ngram.d_hidden", s.ngram->dHidden, 1048576, "");
    atMost("ngram.n", s.ngram->n, 1024, " heads");
  }
  {
    const double bytes = weightBytes(s);
    const long pages = ::sysconf(_SC_PHYS_PAGES), pageSize = ::sysconf(_SC_PAGE_SIZE);
    const double memory = pages > 0 && pageSize > 0 ? double(pages) * double(pageSize) : 0;
    if (memory > 0 && bytes > memory) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "the fp32 weights alone need %.3g GiB, more than this machine's %.3g GiB",
                    bytes / double(1 << 30), memory / double(1 << 30));
      fail("dims", buf);
    }
    // One sentence of max_len tokens needs at least a layer's activations at once (the residual stream, q, k, v,
    // the attention output and the FFN's hidden rows: 6 d + d_ff floats a token, the widest stack's d_ff); the
    // runtime grows its workspaces with the calls made and cuts mask-and-predict copies to its limit, but one
    // such sentence must fit beside the weights (issue 21: check estimates weight and workspace memory).
    double dFF = double(s.dims.dFF);
    if (s.diformer)
      dFF = std::max(double(s.diformer->encoder.dFF), double(s.diformer->decoder.dFF));
    if (s.ngram)
      dFF = std::max(dFF, double(s.ngram->hiddenWidth(s.dims.dModel)));
    const double workspace = 4 * double(s.dims.maxLen) * (6 * double(s.dims.dModel) + dFF);
    if (memory > 0 && bytes + workspace > memory) {
      char buf[240];
      std::snprintf(buf, sizeof buf,
                    "the fp32 weights need %.3g GiB and one sentence of max_len tokens about %.3g GiB of workspace, "
                    "more than this machine's %.3g GiB",
                    bytes / double(1 << 30), workspace / double(1 << 30), memory / double(1 << 30));
      fail("dims", buf);
    }
  }
  if (s.dims.maxLen < 2)
    fail("dims.max_len", "must be at least 2, got " + std::to_string(s.dims.maxLen));
  if (s.dims.dModel % s.dims.heads)
    fail("dims.heads", "heads (" + std::to_string(s.dims.heads) + ") must divide d_model (" +
                           std::to_string(s.dims.dModel) + ")");
  if (!(s.eps > 0) || !std::isfinite(s.eps))
    fail("block.eps", "must be a positive finite number");
  if (s.relativePositions < 0 || s.relativePositions > 65536)
    fail("attention.relative_positions",
         "must be in 0 .. 65536 (0 = off; distances are clipped to max_len - 1 anyway), got " +
             std::to_string(s.relativePositions));

  const std::pair<const char *, int64_t> tokens[] = {{"tokens.pad", s.tokens.pad},
                                                     {"tokens.eos", s.tokens.eos},
                                                     {"tokens.unk", s.tokens.unk},
                                                     {"tokens.bos", s.tokens.bos},
                                                     {"tokens.mask", s.tokens.mask}};
  for (size_t i = 0; i < 5; ++i) {
    auto [field, value] = tokens[i];
    if (value < 0 || value >= s.dims.vocab)
      failEither(field, "dims.vocab", "token id " + std::to_string(value) + " is outside the vocabulary [0, " +
                      std::to_string(s.dims.vocab) + ")");
    for (size_t j = 0; j < i; ++j)
      if (tokens[j].second == value)
        fail(field, "token id " + std::to_string(value) + " is already used by " + tokens[j].first +
                        "; special tokens must be distinct");
  }

  if (s.mask == MaskKind::Directional && s.family != Family::Diformer)
    fail("attention.mask", "\"directional\" needs per-token directions, which only family \"diformer\" provides; "
                           "use none, causal, anticausal or diagonal");
  if (s.family == Family::Diformer && s.mask != MaskKind::Directional)
    fail("attention.mask", "family \"diformer\" decodes with the \"directional\" mask");
  if (s.family == Family::NGram && s.mask != MaskKind::Causal)
    fail("attention.mask", "family \"ngram\" is a causal LM: the mask must be \"causal\"");
  if (s.family == Family::NGram && s.method != ScoreMethod::Causal)
    fail("score.method", "family \"ngram\" is a causal LM: its heads score x_t from x_<t (\"causal\")");

  if (s.firstQuery == FirstQuery::Position && s.position == PositionKind::None)
    failEither("attention.first_query", "embedding.position", "\"position\" needs position embeddings; set [embedding] position to \"learned\" "
                                  "or \"sinusoidal\", or use \"mask+position\"");
  if (s.position == PositionKind::Sinusoidal && s.dims.dModel % 2)
    fail("embedding.position", "\"sinusoidal\" needs an even d_model, got " + std::to_string(s.dims.dModel));

  // Combinations whose scores would see the token being predicted.
  if (s.method == ScoreMethod::Causal && s.family != Family::Diformer && s.mask != MaskKind::Causal)
    failEither("score.method", "attention.mask", std::string("\"causal\" scoring needs mask = \"causal\" (got \"") + toString(s.mask) +
                             "\"), or position t would see x_t");
  if (s.method == ScoreMethod::SinglePass) {
    if (s.mask != MaskKind::Diagonal)
      failEither("score.method", "attention.mask", std::string("\"single-pass\" scoring needs mask = \"diagonal\" (got \"") +
                               toString(s.mask) + "\"), or position i would see x_i");
    if (s.keysValues != KeyValueSource::Embedding)
      failEither("score.method", "attention.keys_values", "\"single-pass\" scoring needs keys_values = \"embedding\" (input isolation): with hidden "
                           "keys/values a stack of diagonal-masked layers sees each token through its neighbours "
                           "(T-TA paper, 4.2)");
    if (s.firstQuery == FirstQuery::Embedding)
      failEither("score.method", "attention.first_query", "\"single-pass\" scoring needs first_query = \"position\" or \"mask+position\": a query "
                           "built from E[x_i] carries the token being predicted");
  }
  if (!s.mlm && (s.family == Family::NGram || s.family == Family::Diformer))
    fail("head.mlm", std::string("family \"") + toString(s.family) + "\" needs its output head; mlm = false applies "
                     "to unilm, bilm and tta");
  if (s.ngram) {
    if (s.ngram->n < 2)
      fail("ngram.n", "must be at least 2 (the main head plus n-1 n-gram heads), got " + std::to_string(s.ngram->n));
    if (s.ngram->n > s.dims.maxLen)
      fail("ngram.n", "must not exceed max_len");
    // The word-difference conjugate sums C(j-1, i) W[x] for every head j: up to n = 26 the coefficients are exact
    // in fp32 (C(25, 12) = 5,200,300 < 2^24) and in the int64 products that compute them; past it they were not
    // (wrong numbers from n = 64 on) and the unrolled conjugate grew as n^2 (lm.wdr_conjugate's verifier: the same).
    if (s.ngram->wdr && s.ngram->n > 26)
      fail("ngram.n", "must be at most 26 with wdr = true (the conjugate's binomial coefficients stay exact in fp32 "
                      "up to C(25, 12)), got " + std::to_string(s.ngram->n));
    if (!(s.ngram->ensembleLambda >= 0 && s.ngram->ensembleLambda <= 1))
      fail("ngram.ensemble_lambda", "must be in [0, 1]");
    if (s.ngram->dHidden < 1)
      fail("ngram.d_hidden", "must be at least 1, got " + std::to_string(s.ngram->dHidden));
    if (s.headTransform)
      fail("head.transform", "family \"ngram\" has no head transform: every head's vector goes straight to the "
                             "shared logit layer W u + b; set transform = false");
  }
  if (s.trainGiven) {
    const TrainOptions &t = s.train;
    if (!(t.lr >= 0) || !std::isfinite(t.lr))
      fail("train.lr", "must be a finite number >= 0");
    if (!(t.beta1 >= 0 && t.beta1 < 1) || !(t.beta2 >= 0 && t.beta2 < 1))
      fail("train.betas", "both betas must be in [0, 1)");
    if (!(t.eps > 0) || !std::isfinite(t.eps))
      fail("train.eps", "must be a finite number > 0");
    if (!(t.weightDecay >= 0) || !std::isfinite(t.weightDecay))
      fail("train.weight_decay", "must be a finite number >= 0");
    if (t.warmupSteps < 0)
      fail("train.warmup_steps", "must be >= 0");
    if (t.steps < 1)
      fail("train.steps", "must be >= 1 (the schedule's total)");
    if (!(t.clipNorm >= 0) || !std::isfinite(t.clipNorm))
      fail("train.clip_norm", "must be a finite number >= 0 (0 = off)");
    for (auto [field, p] : {std::pair<const char *, double>{"train.dropout", t.dropout},
                            {"train.attention_dropout", t.attentionDropout}})
      if (!(p >= 0 && p < 1))
        fail(field, "must be in [0, 1)");
    if (!(t.labelSmoothing >= 0 && t.labelSmoothing <= 1))
      fail("train.label_smoothing", "must be in [0, 1]");
    if (!(t.maskProb > 0 && t.maskProb <= 1))
      fail("train.mask_prob", "must be in (0, 1]");
    if (t.maxMasks < 1)
      fail("train.max_masks", "must be >= 1");
    if (t.seed < 0 || t.seed > 0xffffffffll)
      fail("train.seed", "must be in [0, 2^32)");
    Objective o = resolvedObjective(s);
    if ((o == Objective::Directional) != (s.family == Family::Diformer))
      fail("train.objective", s.family == Family::Diformer
                                  ? "family \"diformer\" trains with the \"directional\" objective"
                                  : "\"directional\" needs family \"diformer\"");
    if ((o == Objective::NGram) != (s.family == Family::NGram))
      fail("train.objective", s.family == Family::NGram
                                  ? "family \"ngram\" trains with objective \"ngram\" (or \"auto\"): the main "
                                    "head and its n-1 heads together"
                                  : "\"ngram\" needs family \"ngram\" (its n-1 extra heads)");
    if (o == Objective::Causal && s.mask != MaskKind::Causal)
      fail("train.objective", "\"causal\" needs mask = \"causal\", or row i would see its target x[i+1]");
    if (o == Objective::Autoencoding && s.method != ScoreMethod::SinglePass)
      fail("train.objective", "\"autoencoding\" needs a model whose row i cannot see x_i (T-TA: diagonal mask, "
                              "input isolation, a query without E[x_i]), or it learns to copy its input");
  }
  if (s.diformer) {
    if (s.position != PositionKind::Learned)
      fail("embedding.position", "family \"diformer\" uses learned position tables (embed.position, "
                                 "decoder.position.{l2r,r2l})");
    if (s.keysValues != KeyValueSource::Embedding)
      fail("attention.keys_values", "family \"diformer\"'s self-attention keys and values come from embed.token "
                                    "alone (input isolation): \"embedding\"");
    if (s.firstQuery != FirstQuery::Position)
      fail("attention.first_query", "family \"diformer\"'s queries are a direction plus a directed position, "
                                    "with no word embedding: \"position\"");
    if (s.method != ScoreMethod::Causal)
      fail("score.method", "family \"diformer\" scores the rows each line's DIRS names; leave method unset");
    if (s.headTransform || !s.tied)
      fail(s.headTransform ? "head.transform" : "head.tied",
           "family \"diformer\"'s output head is tied to embed.token with no transform");
    if (!(s.diformer->lengthLoss >= 0) || !std::isfinite(s.diformer->lengthLoss))
      fail("diformer.length_loss", "must be a finite number >= 0");
    if (s.dims.maxLen < 3)
      fail("dims.max_len", "family \"diformer\" needs max_len >= 3 (bos, a token, eos)");
    for (auto [name, d] : {std::pair<const char *, const StackDims *>{"encoder", &s.diformer->encoder},
                           {"decoder", &s.diformer->decoder}}) {
      if (d->layers < 1 || d->heads < 1 || d->dFF < 1)
        fail(std::string(name), "layers, heads and d_ff must be positive");
      if (s.dims.dModel % d->heads)
        fail(std::string(name) + ".heads", "heads must divide d_model (" + std::to_string(s.dims.dModel) + ")");
    }
  }
}

ModelSpec parseTable(const toml::table &root, const Reader &r) {
  ModelSpec s;
  s.sourcePath = r.path;
  Positions pos;
  recordPositions(r, root, "", pos);

  r.onlyKeys(root, "", {"name", "family", "dims", "embedding", "attention", "block", "head", "tokens", "score",
                        "ngram", "encoder", "decoder", "diformer", "train", "tokenizer", "embed"});
  s.fieldWhere = pos.where;
  const toml::node *name = root.get("name");
  if (!name)
    r.fail(r.path + ":1:1", "name", "missing required key (a C identifier naming the library)");
  if (!name->is_string())
    r.fail(r.at(*name), "name", std::string("expected a string, got ") + Reader::typeName(*name));
  s.name = name->as_string()->get();
  if (!root.get("family"))
    r.fail(r.path + ":1:1", "family", "missing required key; valid values are " + choices(kFamilies));
  r.readEnum(&root, "", "family", kFamilies, s.family);
  applyFamilyDefaults(s);

  const toml::table *dims = r.subTable(root, "dims");
  if (!dims)
    r.fail(r.path + ":1:1", "dims", "missing required table [dims] with vocab, max_len, d_model, heads, d_ff, layers");
  r.onlyKeys(*dims, "dims.", {"vocab", "max_len", "d_model", "heads", "d_ff", "layers"});
  for (const char *key : {"vocab", "max_len", "d_model", "heads", "d_ff", "layers"})
    if (!dims->get(key))
      r.fail(r.at(*dims), std::string("dims.") + key, "missing required key in [dims]");
  r.readInt(dims, "dims.", "vocab", s.dims.vocab);
  r.readInt(dims, "dims.", "max_len", s.dims.maxLen);
  r.readInt(dims, "dims.", "d_model", s.dims.dModel);
  r.readInt(dims, "dims.", "heads", s.dims.heads);
  r.readInt(dims, "dims.", "d_ff", s.dims.dFF);
  r.readInt(dims, "dims.", "layers", s.dims.layers);

  if (const toml::table *t = r.subTable(root, "embedding")) {
    r.onlyKeys(*t, "embedding.", {"position", "norm"});
    r.readEnum(t, "embedding.", "position", kPositions, s.position);
    r.readBool(t, "embedding.", "norm", s.embeddingNorm);
  }
  if (const toml::table *t = r.subTable(root, "attention")) {
    r.onlyKeys(*t, "attention.", {"mask", "keys_values", "first_query", "relative_positions"});
    r.readEnum(t, "attention.", "mask", kMasks, s.mask);
    r.readEnum(t, "attention.", "keys_values", kKeyValues, s.keysValues);
    r.readEnum(t, "attention.", "first_query", kFirstQueries, s.firstQuery);
    r.readInt(t, "attention.", "relative_positions", s.relativePositions);
  }
  if (const toml::table *t = r.subTable(root, "block")) {
    r.onlyKeys(*t, "block.", {"activation", "norm", "eps"});
    r.readEnum(t, "block.", "activation", kActivations, s.activation);
    r.readEnum(t, "block.", "norm", kNorms, s.norm);
    r.readFloat(t, "block.", "eps", s.eps);
  }
  if (const toml::table *t = r.subTable(root, "head")) {
    r.onlyKeys(*t, "head.", {"transform", "tied", "bias", "mlm"});
    r.readBool(t, "head.", "transform", s.headTransform);
    r.readBool(t, "head.", "tied", s.tied);
    r.readBool(t, "head.", "bias", s.headBias);
    r.readBool(t, "head.", "mlm", s.mlm);
  }
  if (const toml::table *t = r.subTable(root, "embed")) {
    r.onlyKeys(*t, "embed.", {"pool", "normalize"});
    r.readEnum(t, "embed.", "pool", kPoolings, s.pool);
    r.readBool(t, "embed.", "normalize", s.normalize);
  }
  if (const toml::table *t = r.subTable(root, "tokenizer")) {
    r.onlyKeys(*t, "tokenizer.", {"vocab", "lowercase", "pad", "eos", "unk", "bos", "mask"});
    TokenizerSpec tok;
    if (!t->get("vocab"))
      r.fail(r.at(*t), "tokenizer.vocab", "missing required key: the WordPiece vocabulary file (one token a line, "
                                          "relative to the spec)");
    r.readString(t, "tokenizer.", "vocab", tok.vocab);
    r.readBool(t, "tokenizer.", "lowercase", tok.lowercase);
    r.readString(t, "tokenizer.", "pad", tok.pad);
    r.readString(t, "tokenizer.", "eos", tok.eos);
    r.readString(t, "tokenizer.", "unk", tok.unk);
    r.readString(t, "tokenizer.", "bos", tok.bos);
    r.readString(t, "tokenizer.", "mask", tok.mask);
    std::filesystem::path vocab(tok.vocab);
    if (vocab.is_relative() && !r.path.empty())
      vocab = std::filesystem::path(r.path).parent_path() / vocab;
    tok.vocabPath = vocab.string();
    s.tokenizer = tok;
  }
  if (const toml::table *t = r.subTable(root, "tokens")) {
    r.onlyKeys(*t, "tokens.", {"pad", "eos", "unk", "bos", "mask"});
    r.readInt(t, "tokens.", "pad", s.tokens.pad);
    r.readInt(t, "tokens.", "eos", s.tokens.eos);
    r.readInt(t, "tokens.", "unk", s.tokens.unk);
    r.readInt(t, "tokens.", "bos", s.tokens.bos);
    r.readInt(t, "tokens.", "mask", s.tokens.mask);
  }
  if (const toml::table *t = r.subTable(root, "score")) {
    r.onlyKeys(*t, "score.", {"method", "skip_special"});
    r.readEnum(t, "score.", "method", kMethods, s.method);
    r.readBool(t, "score.", "skip_special", s.skipSpecial);
  }

  const toml::table *ngram = r.subTable(root, "ngram");
  if (s.family == Family::NGram) {
    s.ngram = NGramOptions{};
    if (ngram) {
      r.onlyKeys(*ngram, "ngram.", {"n", "wdr", "ensemble_lambda", "d_hidden"});
      r.readInt(ngram, "ngram.", "n", s.ngram->n);
      r.readBool(ngram, "ngram.", "wdr", s.ngram->wdr);
      r.readFloat(ngram, "ngram.", "ensemble_lambda", s.ngram->ensembleLambda);
      r.readInt(ngram, "ngram.", "d_hidden", s.ngram->dHidden);
    }
    if (!ngram || !ngram->get("d_hidden"))
      s.ngram->dHidden = s.dims.dModel;
    // The heads share the logit layer W u + b directly (the contract): no head transform. Given
    // `transform = true` is refused in validation; the default becomes false.
    if (!s.fieldWhere.count("head.transform"))
      s.headTransform = false;
  } else if (ngram) {
    r.fail(r.at(*ngram), "ngram", "[ngram] only applies to family \"ngram\"");
  }

  const toml::table *encoder = r.subTable(root, "encoder");
  const toml::table *decoder = r.subTable(root, "decoder");
  if (s.family == Family::Diformer) {
    DiformerOptions d;
    d.encoder = d.decoder = StackDims{s.dims.layers, s.dims.heads, s.dims.dFF};
    for (auto [prefix, table, out] : {std::tuple<std::string, const toml::table *, StackDims *>{"encoder.", encoder, &d.encoder},
                                      {"decoder.", decoder, &d.decoder}}) {
      if (!table)
        continue;
      r.onlyKeys(*table, prefix, {"layers", "heads", "d_ff"});
      r.readInt(table, prefix, "layers", out->layers);
      r.readInt(table, prefix, "heads", out->heads);
      r.readInt(table, prefix, "d_ff", out->dFF);
    }
    if (const toml::table *t = r.subTable(root, "diformer")) {
      r.onlyKeys(*t, "diformer.", {"length_loss"});
      r.readFloat(t, "diformer.", "length_loss", d.lengthLoss);
    }
    s.diformer = d;
  } else if (encoder || decoder || root.get("diformer")) {
    if (!encoder && !decoder)
      r.fail(r.at(*root.get("diformer")), "diformer", "[diformer] only applies to family \"diformer\"");
    const toml::table *t = encoder ? encoder : decoder;
    r.fail(r.at(*t), encoder ? "encoder" : "decoder", "[encoder]/[decoder] only apply to family \"diformer\"");
  }

  if (const toml::table *t = r.subTable(root, "train")) {
    s.trainGiven = true;
    TrainOptions &o = s.train;
    r.onlyKeys(*t, "train.", {"objective", "optimizer", "lr", "betas", "eps", "weight_decay", "warmup_steps",
                              "schedule", "steps", "clip_norm", "dropout", "attention_dropout", "label_smoothing",
                              "mask_prob", "max_masks", "mask_replace", "seed"});
    r.readEnum(t, "train.", "objective", kObjectives, o.objective);
    r.readEnum(t, "train.", "optimizer", kOptimizers, o.optimizer);
    r.readFloat(t, "train.", "lr", o.lr);
    if (const toml::node *n = t->get("betas")) {
      const toml::array *a = n->as_array();
      if (!a || a->size() != 2 || !(*a)[0].is_number() || !(*a)[1].is_number())
        r.fail(r.at(*n), "train.betas", "expected an array of two numbers, e.g. [0.9, 0.999]");
      o.beta1 = (*a)[0].value<double>().value();
      o.beta2 = (*a)[1].value<double>().value();
    }
    r.readFloat(t, "train.", "eps", o.eps);
    r.readFloat(t, "train.", "weight_decay", o.weightDecay);
    r.readInt(t, "train.", "warmup_steps", o.warmupSteps);
    r.readEnum(t, "train.", "schedule", kSchedules, o.schedule);
    r.readInt(t, "train.", "steps", o.steps);
    r.readFloat(t, "train.", "clip_norm", o.clipNorm);
    r.readFloat(t, "train.", "dropout", o.dropout);
    r.readFloat(t, "train.", "attention_dropout", o.attentionDropout);
    r.readFloat(t, "train.", "label_smoothing", o.labelSmoothing);
    r.readFloat(t, "train.", "mask_prob", o.maskProb);
    r.readInt(t, "train.", "max_masks", o.maxMasks);
    r.readEnum(t, "train.", "mask_replace", kMaskReplaces, o.maskReplace);
    r.readInt(t, "train.", "seed", o.seed);
  }

  validate(s, pos, r);
  return s;
}

void appendJsonSpec(nlohmann::ordered_json &j, const ModelSpec &s) {
  j["name"] = s.name;
  j["family"] = toString(s.family);
  j["dims"] = {{"vocab", s.dims.vocab}, {"max_len", s.dims.maxLen}, {"d_model", s.dims.dModel},
               {"heads", s.dims.heads}, {"d_ff", s.dims.dFF},      {"layers", s.dims.layers}};
  j["embedding"] = {{"position", toString(s.position)}, {"norm", s.embeddingNorm}};
  j["attention"] = {{"mask", toString(s.mask)},
                    {"keys_values", toString(s.keysValues)},
                    {"first_query", toString(s.firstQuery)},
                    {"relative_positions", s.relativePositions}};
  j["block"] = {{"activation", toString(s.activation)}, {"norm", toString(s.norm)}, {"eps", s.eps}};
  j["head"] = {{"transform", s.headTransform}, {"tied", s.tied}, {"bias", s.headBias}};
  if (!s.mlm) // new keys and tables only when they differ from the defaults: existing specs keep their hash
    j["head"]["mlm"] = false;
  j["tokens"] = {{"pad", s.tokens.pad}, {"eos", s.tokens.eos}, {"unk", s.tokens.unk},
                 {"bos", s.tokens.bos}, {"mask", s.tokens.mask}};
  j["score"] = {{"method", toString(s.method)}, {"skip_special", s.skipSpecial}};
  if (s.pool != Pooling::Mean || s.normalize)
    j["embed"] = {{"pool", toString(s.pool)}, {"normalize", s.normalize}};
  if (s.tokenizer) {
    nlohmann::ordered_json t = {{"vocab", s.tokenizer->vocab}, {"lowercase", s.tokenizer->lowercase}};
    for (auto [key, value] : {std::pair<const char *, const std::string *>{"pad", &s.tokenizer->pad},
                              {"eos", &s.tokenizer->eos},
                              {"unk", &s.tokenizer->unk},
                              {"bos", &s.tokenizer->bos},
                              {"mask", &s.tokenizer->mask}})
      if (!value->empty())
        t[key] = *value;
    j["tokenizer"] = t;
  }
  if (s.ngram)
    j["ngram"] = {{"n", s.ngram->n},
                  {"wdr", s.ngram->wdr},
                  {"ensemble_lambda", s.ngram->ensembleLambda},
                  {"d_hidden", s.ngram->hiddenWidth(s.dims.dModel)}};
  if (s.diformer) {
    auto stack = [](const StackDims &d) {
      return nlohmann::ordered_json{{"layers", d.layers}, {"heads", d.heads}, {"d_ff", d.dFF}};
    };
    j["encoder"] = stack(s.diformer->encoder);
    j["decoder"] = stack(s.diformer->decoder);
    j["diformer"] = {{"length_loss", s.diformer->lengthLoss}};
  }
  if (s.trainGiven) {
    const TrainOptions &t = s.train;
    j["train"] = {{"objective", toString(t.objective)},
                  {"optimizer", toString(t.optimizer)},
                  {"lr", t.lr},
                  {"betas", {t.beta1, t.beta2}},
                  {"eps", t.eps},
                  {"weight_decay", t.weightDecay},
                  {"warmup_steps", t.warmupSteps},
                  {"schedule", toString(t.schedule)},
                  {"steps", t.steps},
                  {"clip_norm", t.clipNorm},
                  {"dropout", t.dropout},
                  {"attention_dropout", t.attentionDropout},
                  {"label_smoothing", t.labelSmoothing},
                  {"mask_prob", t.maskProb},
                  {"max_masks", t.maxMasks},
                  {"mask_replace", toString(t.maskReplace)},
                  {"seed", t.seed}};
  }
}

std::string tomlValue(const nlohmann::ordered_json &v) {
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i)
      out += (i ? ", " : "") + tomlValue(v[i]);
    return out + "]";
  }
  if (v.is_boolean())
    return v.get<bool>() ? "true" : "false";
  if (v.is_number_float()) {
    // Shortest representation that reads back as the same double.
    char buf[64];
    double value = v.get<double>();
    for (int precision = 1; precision <= 17; ++precision) {
      std::snprintf(buf, sizeof buf, "%.*g", precision, value);
      if (std::strtod(buf, nullptr) == value)
        break;
    }
    std::string s = buf;
    if (s.find_first_of(".eEn") == std::string::npos)
      s += ".0";
    return s;
  }
  return v.dump();
}

} // namespace

void applyFamilyDefaults(ModelSpec &s) {
  switch (s.family) {
  case Family::UniLM:
  case Family::NGram:
    s.mask = MaskKind::Causal, s.keysValues = KeyValueSource::Hidden, s.firstQuery = FirstQuery::Embedding;
    s.method = ScoreMethod::Causal;
    break;
  case Family::BiLM:
    s.mask = MaskKind::None, s.keysValues = KeyValueSource::Hidden, s.firstQuery = FirstQuery::Embedding;
    s.method = ScoreMethod::MaskAndPredict;
    break;
  case Family::TTA:
    s.mask = MaskKind::Diagonal, s.keysValues = KeyValueSource::Embedding, s.firstQuery = FirstQuery::Position;
    s.method = ScoreMethod::SinglePass;
    break;
  case Family::Diformer:
    // Decoder: per-token directional mask, keys/values from word embeddings only,
    // query = direction + directed position; scored left-to-right or right-to-left.
    s.mask = MaskKind::Directional, s.keysValues = KeyValueSource::Embedding, s.firstQuery = FirstQuery::Position;
    s.method = ScoreMethod::Causal;
    s.relativePositions = 16;
    s.embeddingNorm = false; // issue 19: one switch for embed.norm and decoder.embed_norm, default off
    s.headTransform = false; // tied to embed.token plus head.bias, no transform
    break;
  }
}

/// TOML allows non-ASCII bytes only inside strings and comments, and no control character but tab and
/// newlines. Checked before toml++ sees the text: its 3.3 release (Debian bookworm's) reaches
/// __builtin_unreachable() when it asks whether some non-ASCII code points (U+00A1-U+0499 among them) are
/// whitespace, which it does for every character it scans outside a string (found by tests/fuzz/spec_fuzzer.cpp;
/// regression inputs in tests/fuzz/regressions/spec/). So a quote counts as opening a string only where toml++
/// opens one: at the start of a value (after `=`, `[` or `,` of an array, or a line of a multi-line array), or of
/// a key (line start, `{`, `,` of an inline table, `.` of a dotted key, `[` of a table header); inside a bare
/// value (toml++ reads a number, date or boolean up to whitespace, `,`, `]`, `}` or `#`) a quote is one more
/// character, as are `=`, `.`, `[` and `{`.
void checkAsciiOutsideStrings(const std::string &text, const std::string &path) {
  size_t line = 1, lineStart = 0;
  const size_t n = text.size();
  // Control characters other than tab, LF and CR are not TOML anywhere (not even in comments or strings).
  for (size_t k = 0; k < n; ++k) {
    const unsigned char b = static_cast<unsigned char>(text[k]);
    if (b == '\n')
      ++line, lineStart = k + 1;
    else if ((b < 0x20 && b != '\t' && b != '\r') || b == 0x7f)
      throw SpecError(path + ":" + std::to_string(line) + ":" + std::to_string(k - lineStart + 1), "",
                      "invalid TOML: control character " + std::to_string(b) + " (only tab and newlines are allowed)");
  }
  size_t i = 0;
  line = 1, lineStart = 0;
  auto newline = [&](size_t at) { ++line, lineStart = at + 1; };
  char previous = '\n';  // the last character that is not a space or tab
  bool key = true;        // reading a key (or a table header), not a value
  bool bare = false;      // inside a bare value
  std::string containers; // the open arrays ('[') and inline tables ('{') of the value being read
  size_t dots = 0;        // the dots of the key being read: toml++ nests a table per dot, recursively
  while (i < n) {
    const char c = text[i];
    if (key && c == '.' && ++dots > 64) // 50,000 levels overflowed toml++'s stack (issue 21: never a crash)
      throw SpecError(path + ":" + std::to_string(line) + ":" + std::to_string(i - lineStart + 1), "",
                      "invalid TOML for lmcc: a key nested deeper than 64 levels");
    if (c == '\n' || c == '=' || c == ',')
      dots = 0;
    if (c == '#') {
      while (i < n && text[i] != '\n')
        ++i;
      bare = false;
      continue;
    }
    const bool quote = c == '"' || c == '\'';
    const bool stringStart =
        quote && (key ? previous == '\n' || previous == '{' || previous == ',' || previous == '.' || previous == '['
                      : !bare);
    if (!stringStart) {
      const bool space = c == ' ' || c == '\t' || c == '\r' || c == '\n';
      if (space || c == ',' || c == ']' || c == '}') // value terminators end a bare value
        bare = false;
      else if (!key && !bare && (c == '[' || c == '{'))
        containers += c, key = c == '{';
      else if (key && c == '=')
        key = false;
      else if (!key && !bare)
        bare = true;
      if (c == ',')
        key = !containers.empty() && containers.back() == '{';
      if ((c == ']' || c == '}') && !containers.empty() && containers.back() == (c == ']' ? '[' : '{'))
        containers.pop_back(), key = false;
      if (c == '\n' && containers.empty())
        key = true;
    }
    if (c != ' ' && c != '\t' && c != '\r')
      previous = c;
    if (stringStart) {
      previous = c;
      const bool basic = c == '"';
      const bool multi = text.compare(i, 3, std::string(3, c)) == 0;
      i += multi ? 3 : 1;
      while (i < n) {
        if (multi && static_cast<unsigned char>(text[i]) >= 0x80) // toml++ 3.3 trips on them after a "\\" line end
          throw SpecError(path + ":" + std::to_string(line) + ":" + std::to_string(i - lineStart + 1), "",
                          "invalid TOML for lmcc: a non-ASCII character in a multi-line string");
        if (basic && text[i] == '\\') {
          if (i + 1 < n && text[i + 1] == '\n')
            newline(i + 1);
          i += 2;
          continue;
        }
        if (text[i] == '\n') {
          newline(i);
          if (!multi)
            break; // an unterminated string: toml++ reports it
        }
        if (text[i] == c && (!multi || text.compare(i, 3, std::string(3, c)) == 0)) {
          i += multi ? 3 : 1;
          while (multi && i < n && text[i] == c) // four or five quotes: the string ends in one or two
            ++i;
          break;
        }
        ++i;
      }
      continue;
    }
    if (c == '\n')
      newline(i);
    if (static_cast<unsigned char>(c) >= 0x80)
      throw SpecError(path + ":" + std::to_string(line) + ":" + std::to_string(i - lineStart + 1), "",
                      "invalid TOML: a non-ASCII character outside a string or comment");
    ++i;
  }
}

ModelSpec parseSpec(const std::string &text, const std::string &path) {
  Reader reader(path);
  checkAsciiOutsideStrings(text, path);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error &err) {
    throw SpecError(reader.at(err.source()), "", "invalid TOML: " + std::string(err.description()));
  }
  return parseTable(root, reader);
}

ModelSpec loadSpec(const std::string &path) {
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw SpecError(path, "", "is a directory, not a spec file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw SpecError(path, "", "cannot open the spec file");
  // At most 16 MiB (a spec is a few hundred bytes; /dev/zero or a mistaken data file would fill the memory).
  constexpr std::streamsize kMaxSpecBytes = std::streamsize(16) << 20;
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, size_t(in.gcount()));
    if (std::streamsize(text.size()) > kMaxSpecBytes)
      throw SpecError(path, "", "is larger than 16 MiB: not a spec file");
  }
  if (in.bad())
    throw SpecError(path, "", "cannot read the spec file");
  return parseSpec(text, path);
}

std::string toJson(const ModelSpec &spec) {
  nlohmann::ordered_json j;
  appendJsonSpec(j, spec);
  return j.dump(2);
}

std::string toToml(const ModelSpec &spec) {
  nlohmann::ordered_json j;
  appendJsonSpec(j, spec);
  std::string out;
  for (auto &[key, value] : j.items())
    if (!value.is_object())
      out += key + " = " + tomlValue(value) + "\n";
  for (auto &[key, value] : j.items()) {
    if (!value.is_object())
      continue;
    out += "\n[" + key + "]\n";
    for (auto &[k, v] : value.items())
      out += k + " = " + tomlValue(v) + "\n";
  }
  return out;
}

std::string specHash(const ModelSpec &spec) {
  nlohmann::ordered_json j;
  appendJsonSpec(j, spec);
  uint64_t h = 1469598103934665603ull; // FNV-1a 64
  for (unsigned char c : j.dump()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

const char *toString(Family v) { return nameOf(kFamilies, v); }
const char *toString(PositionKind v) { return nameOf(kPositions, v); }
const char *toString(MaskKind v) { return nameOf(kMasks, v); }
const char *toString(KeyValueSource v) { return nameOf(kKeyValues, v); }
const char *toString(FirstQuery v) { return nameOf(kFirstQueries, v); }
const char *toString(Activation v) { return nameOf(kActivations, v); }
const char *toString(NormPlacement v) { return nameOf(kNorms, v); }
const char *toString(ScoreMethod v) { return nameOf(kMethods, v); }
const char *toString(Objective v) { return nameOf(kObjectives, v); }
const char *toString(OptimizerKind v) { return nameOf(kOptimizers, v); }
const char *toString(Schedule v) { return nameOf(kSchedules, v); }
const char *toString(MaskReplace v) { return nameOf(kMaskReplaces, v); }

Objective resolvedObjective(const ModelSpec &spec) {
  if (spec.train.objective != Objective::Auto)
    return spec.train.objective;
  switch (spec.family) {
  case Family::UniLM: return Objective::Causal;
  case Family::NGram: return Objective::NGram;
  case Family::BiLM: return Objective::Masked;
  case Family::Diformer: return Objective::Directional;
  case Family::TTA: break;
  }
  return Objective::Autoencoding;
}
const char *toString(Pooling v) { return nameOf(kPoolings, v); }

} // namespace lmcc
