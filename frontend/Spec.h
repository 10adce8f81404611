//===- Spec.h - Declarative model specifications ---------------------------===//
//
// A ModelSpec is the resolved form of a model TOML file: every default filled in,
// every field validated. This header is plain C++ (no MLIR, no toml++) so that the
// reference executor, the weights loader and MLIRGen can all read it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace lmcc {

enum class Family { UniLM, BiLM, TTA, NGram, Diformer };
enum class PositionKind { Learned, Sinusoidal, None };
enum class MaskKind { None, Causal, Anticausal, Diagonal, Directional };
enum class KeyValueSource { Hidden, Embedding };
enum class FirstQuery { Embedding, Position, MaskPosition };
enum class Activation { Gelu, GeluTanh, Relu };
enum class NormPlacement { Post, Pre };
enum class ScoreMethod { Causal, MaskAndPredict, SinglePass };
/// Training objectives ([train] objective); Auto resolves to the family's (resolvedObjective).
enum class Objective { Auto, Causal, Masked, Autoencoding, Directional, NGram };
enum class OptimizerKind { AdamW, Adam, SGD };
enum class Schedule { Linear, Constant, Cosine };
enum class MaskReplace { Mask, Bert };
/// [embed] pool: mean over non-special positions, mean over every valid position
/// (sentence-transformers' mean pooling), or the first (bos / [CLS]) row.
enum class Pooling { Mean, MeanAll, Cls };

struct Dims {
  int64_t vocab = 0, maxLen = 0, dModel = 0, heads = 0, dFF = 0, layers = 0;
  int64_t headDim() const { return dModel / heads; }
};

/// One transformer stack's size (Diformer has an encoder and a decoder stack).
struct StackDims {
  int64_t layers = 0, heads = 0, dFF = 0;
};

struct TokenIds {
  int64_t pad = 0, eos = 1, unk = 2, bos = 3, mask = 4;
};

/// [tokenizer]: a BERT WordPiece tokenizer for `--text` input.
struct TokenizerSpec {
  std::string vocab;     ///< as written in the spec (relative to the spec's directory)
  std::string vocabPath; ///< resolved against the spec's directory (not part of the resolved spec)
  bool lowercase = true; ///< BERT uncased: lowercase + NFD + strip accents
  /// Special token strings; empty = the vocabulary line of the [tokens] id. When given, the
  /// string's line in the vocabulary must be that id.
  std::string pad, eos, unk, bos, mask;
};

/// [ngram] (issue 18's contract): the main head plus n-1 MLP heads; head j (2..n) at row s predicts
/// x_{s+j} from u_j = out_j(act(in_j(H_s))) [+ the WDR conjugate], through the shared logit layer.
struct NGramOptions {
  int64_t n = 3;                ///< the paper's N: the main head plus n-1 MLP heads (n >= 2)
  bool wdr = true;              ///< add the word-difference conjugate (stop-gradient rows of W) to each head
  double ensembleLambda = 0.4;  ///< weight of the heads in the logit-space ensemble at inference
  int64_t dHidden = 0;          ///< the heads' hidden width; 0 in a spec built in code = d_model
  int64_t hiddenWidth(int64_t dModel) const { return dHidden > 0 ? dHidden : dModel; }
};

/// [train]: the optimizer, schedule and objective of compiled training (issue 14's contract).
struct TrainOptions {
  Objective objective = Objective::Auto;
  OptimizerKind optimizer = OptimizerKind::AdamW;
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-6;
  double weightDecay = 0.01;    ///< decoupled for adamw, L2 for adam/sgd; never on rank-1 tensors
  int64_t warmupSteps = 0;
  Schedule schedule = Schedule::Linear;
  int64_t steps = 1000;         ///< the schedule's total
  double clipNorm = 1.0;        ///< global L2 norm; 0 = off
  double dropout = 0.0;
  double attentionDropout = 0.0;
  double labelSmoothing = 0.0;
  double maskProb = 0.15;
  int64_t maxMasks = 20;
  MaskReplace maskReplace = MaskReplace::Mask;
  int64_t seed = 1;

};

struct DiformerOptions {
  StackDims encoder, decoder;   ///< default to [dims]
  double lengthLoss = 0.1;      ///< [diformer] length_loss: weight of the length head's NLL in the loss
};

struct ModelSpec {
  std::string name;
  Family family = Family::TTA;
  Dims dims;
  // [embedding]
  PositionKind position = PositionKind::Learned;
  bool embeddingNorm = true;
  // [attention]
  MaskKind mask = MaskKind::Diagonal;
  KeyValueSource keysValues = KeyValueSource::Embedding;
  FirstQuery firstQuery = FirstQuery::Position;
  int64_t relativePositions = 0;
  // [block]
  Activation activation = Activation::Gelu;
  NormPlacement norm = NormPlacement::Post;
  double eps = 1e-12;
  // [head]
  bool headTransform = true;
  bool tied = true;
  bool headBias = true;
  bool mlm = true; ///< false: encoder only (no output head; embed works, score does not)
  // [embed]
  Pooling pool = Pooling::Mean;
  bool normalize = false; ///< L2-normalize the embedding
  // [tokenizer]
  std::optional<TokenizerSpec> tokenizer;
  // [tokens]
  TokenIds tokens;
  // [score]
  ScoreMethod method = ScoreMethod::SinglePass;
  bool skipSpecial = true;
  // family extensions
  std::optional<NGramOptions> ngram;
  std::optional<DiformerOptions> diformer;
  // [train]: defaults unless the table is given (resolved specs print it only then, so the
  // hash of a spec without [train] does not change)
  TrainOptions train;
  bool trainGiven = false;

  /// Path the spec was read from (for messages); empty when built in code.
  std::string sourcePath;
  /// "file:line:column" of the fields given in the file ("head.mlm", "tokenizer.vocab", ...).
  std::map<std::string, std::string> fieldWhere;
  std::string where(const std::string &field) const {
    auto it = fieldWhere.find(field);
    return it == fieldWhere.end() ? sourcePath : it->second;
  }
};

/// A spec error: `where` is "file:line:column" (or "file" when no position applies).
struct SpecError : std::runtime_error {
  SpecError(const std::string &where, const std::string &field, const std::string &what)
      : std::runtime_error(printable(where + ": error: " + (field.empty() ? "" : "'" + field + "': ") + what)),
        where(where), field(field) {}
  std::string where, field;

  /// The message with control bytes other than newline and tab written as \xNN: a spec's strings may hold any
  /// (TOML's "\u0000"), and a NUL ended the message where it was printed as a C string.
  static std::string printable(const std::string &text) {
    std::string out;
    for (unsigned char c : text) {
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
        static const char hex[] = "0123456789abcdef";
        out += {'\\', 'x', hex[c >> 4], hex[c & 15]};
      } else {
        out += char(c);
      }
    }
    return out;
  }
};

/// Parses and validates a spec file; throws SpecError.
ModelSpec loadSpec(const std::string &path);
/// Parses and validates spec text; `path` is only used in messages.
ModelSpec parseSpec(const std::string &text, const std::string &path);

/// Sets the fields whose defaults depend on the family (mask, keys_values,
/// first_query, method; relative_positions for diformer), as the parser does.
void applyFamilyDefaults(ModelSpec &spec);

/// The resolved spec as TOML (every default filled) and as JSON.
std::string toToml(const ModelSpec &spec);
std::string toJson(const ModelSpec &spec);
/// A stable 64-bit FNV-1a hash of the resolved spec (hex), recorded in weight metadata.
std::string specHash(const ModelSpec &spec);

/// The objective `auto` stands for: unilm causal, bilm masked, tta autoencoding, diformer directional, ngram
/// ngram.
Objective resolvedObjective(const ModelSpec &spec);

const char *toString(Family);
const char *toString(PositionKind);
const char *toString(MaskKind);
const char *toString(KeyValueSource);
const char *toString(FirstQuery);
const char *toString(Activation);
const char *toString(NormPlacement);
const char *toString(ScoreMethod);
const char *toString(Objective);
const char *toString(OptimizerKind);
const char *toString(Schedule);
const char *toString(MaskReplace);
const char *toString(Pooling);

} // namespace lmcc
