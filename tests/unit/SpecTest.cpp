// Spec parser: defaults per family, resolved output, and every kind of bad spec
// rejected with file:line:column and the field.
#include "frontend/Spec.h"
#include "tests/unit/TestPaths.h"

#include <gtest/gtest.h>

#include <string>

using namespace lmcc;

namespace {

std::string base(const std::string &family, const std::string &extra = "") {
  return "name = \"m\"\nfamily = \"" + family +
         "\"\n[dims]\nvocab = 50\nmax_len = 16\nd_model = 12\nheads = 3\nd_ff = 20\nlayers = 2\n" + extra;
}

/// Parses `text` expecting an error; returns the message.
std::string errorOf(const std::string &text) {
  try {
    parseSpec(text, "t.toml");
  } catch (const SpecError &e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a SpecError for:\n" << text;
  return "";
}

} // namespace

TEST(Spec, TTADefaults) {
  ModelSpec s = parseSpec(base("tta"), "t.toml");
  EXPECT_EQ(s.mask, MaskKind::Diagonal);
  EXPECT_EQ(s.keysValues, KeyValueSource::Embedding);
  EXPECT_EQ(s.firstQuery, FirstQuery::Position);
  EXPECT_EQ(s.method, ScoreMethod::SinglePass);
  EXPECT_EQ(s.position, PositionKind::Learned);
  EXPECT_TRUE(s.embeddingNorm);
  EXPECT_EQ(s.activation, Activation::Gelu);
  EXPECT_EQ(s.norm, NormPlacement::Post);
  EXPECT_DOUBLE_EQ(s.eps, 1e-12);
  EXPECT_TRUE(s.headTransform && s.tied && s.headBias && s.skipSpecial);
  EXPECT_EQ(s.tokens.pad, 0);
  EXPECT_EQ(s.tokens.eos, 1);
  EXPECT_EQ(s.tokens.unk, 2);
  EXPECT_EQ(s.tokens.bos, 3);
  EXPECT_EQ(s.tokens.mask, 4);
  EXPECT_EQ(s.relativePositions, 0);
}

TEST(Spec, UniLMDefaults) {
  ModelSpec s = parseSpec(base("unilm"), "t.toml");
  EXPECT_EQ(s.mask, MaskKind::Causal);
  EXPECT_EQ(s.keysValues, KeyValueSource::Hidden);
  EXPECT_EQ(s.firstQuery, FirstQuery::Embedding);
  EXPECT_EQ(s.method, ScoreMethod::Causal);
}

TEST(Spec, BiLMDefaults) {
  ModelSpec s = parseSpec(base("bilm"), "t.toml");
  EXPECT_EQ(s.mask, MaskKind::None);
  EXPECT_EQ(s.keysValues, KeyValueSource::Hidden);
  EXPECT_EQ(s.firstQuery, FirstQuery::Embedding);
  EXPECT_EQ(s.method, ScoreMethod::MaskAndPredict);
}

TEST(Spec, NGramDefaults) {
  ModelSpec s = parseSpec(base("ngram"), "t.toml");
  EXPECT_EQ(s.mask, MaskKind::Causal);
  EXPECT_EQ(s.method, ScoreMethod::Causal);
  ASSERT_TRUE(s.ngram.has_value());
  EXPECT_EQ(s.ngram->n, 3);
  EXPECT_TRUE(s.ngram->wdr);
  EXPECT_DOUBLE_EQ(s.ngram->ensembleLambda, 0.4);
  ModelSpec t = parseSpec(base("ngram", "[ngram]\nn = 4\nwdr = false\nensemble_lambda = 0.25\n"), "t.toml");
  EXPECT_EQ(t.ngram->n, 4);
  EXPECT_FALSE(t.ngram->wdr);
  EXPECT_DOUBLE_EQ(t.ngram->ensembleLambda, 0.25);
}

TEST(Spec, DiformerDefaults) {
  ModelSpec s = parseSpec(base("diformer", "[decoder]\nlayers = 4\n"), "t.toml");
  EXPECT_EQ(s.mask, MaskKind::Directional);
  EXPECT_EQ(s.keysValues, KeyValueSource::Embedding);
  EXPECT_EQ(s.relativePositions, 16);
  ASSERT_TRUE(s.diformer.has_value());
  EXPECT_EQ(s.diformer->encoder.layers, 2);
  EXPECT_EQ(s.diformer->decoder.layers, 4);
  EXPECT_EQ(s.diformer->decoder.heads, 3);
  EXPECT_EQ(s.norm, NormPlacement::Post);
  // "post-norm by default": [block] norm = "pre" applies to both stacks.
  EXPECT_EQ(parseSpec(base("diformer", "[block]\nnorm = \"pre\"\n"), "t.toml").norm, NormPlacement::Pre);
}

TEST(Spec, EveryFieldOverridable) {
  ModelSpec s = parseSpec(base("bilm", R"(
[embedding]
position = "sinusoidal"
norm = false
[attention]
mask = "anticausal"
keys_values = "embedding"
first_query = "mask+position"
relative_positions = 4
[block]
activation = "gelu_tanh"
norm = "pre"
eps = 1e-5
[head]
transform = false
tied = false
bias = false
[tokens]
pad = 10
eos = 11
unk = 12
bos = 13
mask = 14
[score]
method = "mask-and-predict"
skip_special = false
)"),
                          "t.toml");
  EXPECT_EQ(s.position, PositionKind::Sinusoidal);
  EXPECT_FALSE(s.embeddingNorm);
  EXPECT_EQ(s.mask, MaskKind::Anticausal);
  EXPECT_EQ(s.keysValues, KeyValueSource::Embedding);
  EXPECT_EQ(s.firstQuery, FirstQuery::MaskPosition);
  EXPECT_EQ(s.relativePositions, 4);
  EXPECT_EQ(s.activation, Activation::GeluTanh);
  EXPECT_EQ(s.norm, NormPlacement::Pre);
  EXPECT_DOUBLE_EQ(s.eps, 1e-5);
  EXPECT_FALSE(s.headTransform || s.tied || s.headBias || s.skipSpecial);
  EXPECT_EQ(s.tokens.mask, 14);
}

TEST(Spec, ResolvedRoundTrip) {
  for (const char *family : {"unilm", "bilm", "tta", "ngram", "diformer"}) {
    ModelSpec s = parseSpec(base(family), "t.toml");
    ModelSpec again = parseSpec(toToml(s), "resolved.toml");
    EXPECT_EQ(toJson(s), toJson(again)) << family;
    EXPECT_EQ(specHash(s), specHash(again)) << family;
  }
  EXPECT_NE(specHash(parseSpec(base("tta"), "a")), specHash(parseSpec(base("bilm"), "a")));
}

TEST(SpecErrors, MissingRequired) {
  EXPECT_NE(errorOf("family = \"tta\"\n[dims]\nvocab = 5\n").find("'name': missing required key"), std::string::npos);
  EXPECT_NE(errorOf("name = \"m\"\n[dims]\n").find("'family': missing required key"), std::string::npos);
  EXPECT_NE(errorOf("name = \"m\"\nfamily = \"tta\"\n").find("'dims': missing required table"), std::string::npos);
  std::string e = errorOf("name = \"m\"\nfamily = \"tta\"\n[dims]\nvocab = 50\nmax_len = 16\nd_model = 12\nheads = 3\n"
                          "d_ff = 20\n");
  EXPECT_NE(e.find("t.toml:3:1"), std::string::npos) << e;
  EXPECT_NE(e.find("'dims.layers': missing required key"), std::string::npos) << e;
}

TEST(SpecErrors, UnknownKeys) {
  std::string e = errorOf(base("tta", "[head]\ntied = true\nbais = true\n"));
  EXPECT_NE(e.find("t.toml:12:1: error: 'head.bais': unknown key"), std::string::npos) << e;
  EXPECT_NE(e.find("bias"), std::string::npos) << e;
  EXPECT_NE(errorOf("colour = 1\n" + base("tta")).find("'colour': unknown key"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[extras]\nx = 1\n")).find("'extras': unknown key"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[ngram]\nn = 3\n")).find("only applies to family \"ngram\""), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[encoder]\nlayers = 3\n")).find("only apply to family \"diformer\""),
            std::string::npos);
}

TEST(SpecErrors, WrongTypes) {
  EXPECT_NE(errorOf(base("tta", "[block]\neps = \"small\"\n")).find("t.toml:11:7: error: 'block.eps': expected a number"),
            std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[head]\ntied = 1\n")).find("'head.tied': expected true or false, got an integer"),
            std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[attention]\nmask = 3\n")).find("'attention.mask': expected a string"),
            std::string::npos);
  EXPECT_NE(errorOf("embedding = 3\n" + base("tta")).find("expected a table"), std::string::npos);
  EXPECT_NE(errorOf("name = 5\n").find("'name': expected a string"), std::string::npos);
}

TEST(SpecErrors, UnknownEnumValues) {
  std::string e = errorOf(base("tta", "[block]\nactivation = \"swish\"\n"));
  EXPECT_NE(e.find("t.toml:11:14: error: 'block.activation': unknown value \"swish\""), std::string::npos) << e;
  EXPECT_NE(e.find("\"gelu\", \"gelu_tanh\", \"relu\""), std::string::npos) << e;
  EXPECT_NE(errorOf(base("gpt")).find("'family': unknown value \"gpt\""), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[embedding]\nposition = \"rotary\"\n")).find("'embedding.position'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("bilm", "[score]\nmethod = \"pll\"\n")).find("'score.method'"), std::string::npos);
}

TEST(SpecErrors, ImpossibleValues) {
  auto dims = [](const std::string &d) {
    return "name = \"m\"\nfamily = \"bilm\"\n[dims]\n" + d;
  };
  EXPECT_NE(errorOf(dims("vocab = 50\nmax_len = 16\nd_model = 12\nheads = 5\nd_ff = 20\nlayers = 2\n"))
                .find("t.toml:7:9: error: 'dims.heads': heads (5) must divide d_model (12)"),
            std::string::npos);
  EXPECT_NE(errorOf(dims("vocab = 50\nmax_len = 1\nd_model = 12\nheads = 3\nd_ff = 20\nlayers = 2\n"))
                .find("'dims.max_len': must be at least 2"),
            std::string::npos);
  EXPECT_NE(errorOf(dims("vocab = 50\nmax_len = 16\nd_model = 12\nheads = 3\nd_ff = 0\nlayers = 2\n"))
                .find("'dims.d_ff': must be a positive integer"),
            std::string::npos);
  EXPECT_NE(errorOf(dims("vocab = 50\nmax_len = 16\nd_model = 12\nheads = 3\nd_ff = 20\nlayers = -1\n"))
                .find("'dims.layers'"),
            std::string::npos);
  EXPECT_NE(errorOf("name = \"2fast\"\n" + base("tta").substr(11)).find("is not a C identifier"), std::string::npos);
  // A NUL (TOML's \u0000) in an echoed string is written \x00, and the message goes on past it (a C-string print of
  // the message ended at the NUL before).
  EXPECT_NE(errorOf("name = \"a\\u0000b\"\n" + base("tta").substr(11)).find("\"a\\x00b\" is not a C identifier"),
            std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[block]\neps = 0\n")).find("'block.eps': must be a positive"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[attention]\nrelative_positions = -2\n")).find("'attention.relative_positions'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("ngram", "[ngram]\nn = 1\n")).find("'ngram.n': must be at least 2"), std::string::npos);
  // The word-difference conjugate's coefficients C(n-1, i) are exact in fp32 up to n = 26 (past 62 the int64
  // products computing them overflowed: wrong numbers with rc 0); without wdr the heads have no coefficients.
  const std::string wide = "name = \"m\"\nfamily = \"ngram\"\n[dims]\nvocab = 50\nmax_len = 40\nd_model = 12\n"
                           "heads = 3\nd_ff = 20\nlayers = 1\n[ngram]\n";
  EXPECT_NE(errorOf(wide + "n = 27\nwdr = true\n").find("'ngram.n': must be at most 26 with wdr = true"),
            std::string::npos);
  EXPECT_EQ(parseSpec(wide + "n = 26\nwdr = true\n", "t.toml").ngram->n, 26);
  EXPECT_EQ(parseSpec(wide + "n = 27\nwdr = false\n", "t.toml").ngram->n, 27);
  EXPECT_NE(errorOf(base("ngram", "[ngram]\nensemble_lambda = 1.5\n")).find("'ngram.ensemble_lambda'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[embedding]\nposition = \"none\"\n")).find("t.toml:11:12: error: 'embedding.position'"),
            std::string::npos);
}

TEST(SpecErrors, TokenIds) {
  std::string e = errorOf(base("tta", "[tokens]\nmask = 50\n"));
  EXPECT_NE(e.find("t.toml:11:8: error: 'tokens.mask': token id 50 is outside the vocabulary [0, 50)"),
            std::string::npos)
      << e;
  EXPECT_NE(errorOf(base("tta", "[tokens]\nbos = 1\n")).find("'tokens.bos': token id 1 is already used by tokens.eos"),
            std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[tokens]\npad = -1\n")).find("'tokens.pad'"), std::string::npos);
}

TEST(SpecErrors, LeakingCombinations) {
  // causal scoring needs the causal mask
  EXPECT_NE(errorOf(base("unilm", "[attention]\nmask = \"none\"\n")).find("\"causal\" scoring needs mask = \"causal\""),
            std::string::npos);
  // single-pass scoring needs the diagonal mask, isolated keys/values, and a token-free first query
  EXPECT_NE(errorOf(base("tta", "[attention]\nmask = \"none\"\n")).find("needs mask = \"diagonal\""), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[attention]\nkeys_values = \"hidden\"\n")).find("keys_values = \"embedding\""),
            std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[attention]\nfirst_query = \"embedding\"\n")).find("first_query = \"position\""),
            std::string::npos);
  EXPECT_NE(errorOf(base("bilm", "[score]\nmethod = \"single-pass\"\n")).find("t.toml:11:10"), std::string::npos);
  EXPECT_NE(errorOf(base("bilm", "[attention]\nmask = \"directional\"\n")).find("only family \"diformer\""),
            std::string::npos);
  // A clash with a family default points at the field the file writes.
  EXPECT_NE(errorOf(base("tta", "[attention]\nkeys_values = \"hidden\"\n")).find("t.toml:11:15: error: 'attention.keys_values'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("unilm", "[attention]\nmask = \"none\"\n")).find("t.toml:11:8: error: 'attention.mask'"),
            std::string::npos);
  // The families whose structure the contract fixes refuse the settings they would otherwise ignore.
  EXPECT_NE(errorOf(base("diformer", "[attention]\nkeys_values = \"hidden\"\n")).find("'attention.keys_values'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("diformer", "[attention]\nfirst_query = \"embedding\"\n")).find("'attention.first_query'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("diformer", "[score]\nmethod = \"mask-and-predict\"\n")).find("'score.method'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("ngram", "[score]\nmethod = \"mask-and-predict\"\n")).find("family \"ngram\" is a causal LM"),
            std::string::npos);
}

TEST(SpecErrors, InvalidToml) {
  std::string e = errorOf("name = \"m\"\nfamily = = \"tta\"\n");
  EXPECT_NE(e.find("t.toml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("invalid TOML"), std::string::npos) << e;
  EXPECT_THROW(loadSpec("/nonexistent/spec.toml"), SpecError);
}

/// Non-ASCII text is TOML only inside strings and comments, and toml++ 3.3 reaches __builtin_unreachable() on some
/// code points it scans outside a string (U+0382 here), so the spec reader rejects them first. A quote opens a
/// string where toml++ opens one (values, array elements, quoted and dotted keys, table headers), not inside a
/// bare value, where toml++ reads on through quotes, dots and '='.
TEST(SpecErrors, NonAsciiOutsideStrings) {
  const std::string u0382 = "\xce\x82", e = "\xc3\xa9";
  for (const std::string &line :
       {"x = 1." + u0382, "x = 1.'" + u0382 + "'", "x = a='" + u0382 + "'", "x = [1, a'" + u0382 + "']",
        "x = 1979-05-27 0'" + u0382 + "'", "x = 'a'" + u0382, "x = " + u0382, "a" + u0382 + " = 1"}) {
    std::string err = errorOf(base("tta", line + "\n"));
    EXPECT_NE(err.find("a non-ASCII character outside a string or comment"), std::string::npos) << line << ": " << err;
  }
  // In strings (values, arrays over lines, inline tables, quoted, dotted and header keys) and comments they reach
  // the spec's own checks: the unknown key, not the TOML.
  for (const std::string &line :
       {"x = \"" + e + "\"", "x = [\"" + e + "\",\n  '" + u0382 + "'\n]", "x = { a = \"" + e + "\", b.'" + e + "' = '" + u0382 + "' }",
        "\"" + u0382 + "\" = 1", "x.\"" + e + "\" = 1", "x = 1 # " + u0382}) {
    std::string err = errorOf(base("tta", line + "\n"));
    EXPECT_NE(err.find("unknown key"), std::string::npos) << line << ": " << err;
  }
  std::string err = errorOf(base("tta", "[\"" + u0382 + "\"]\n"));
  EXPECT_NE(err.find("unknown key"), std::string::npos) << err;
}

TEST(Spec, BundledModelsLoad) {
  for (const char *m : {"tta_base", "tta_mask_base", "bilm_base", "unilm_base", "bert_base", "ngram_clm",
                        "diformer_base"}) {
    ModelSpec s = loadSpec(std::string(test::kSourceDir) + "/models/" + m + ".toml");
    EXPECT_EQ(s.name, m);
  }
}

TEST(Spec, TrainDefaultsAndOverrides) {
  ModelSpec plain = parseSpec(base("bilm"), "t.toml");
  EXPECT_FALSE(plain.trainGiven);
  EXPECT_EQ(resolvedObjective(plain), Objective::Masked);
  EXPECT_EQ(resolvedObjective(parseSpec(base("unilm"), "t.toml")), Objective::Causal);
  EXPECT_EQ(resolvedObjective(parseSpec(base("tta"), "t.toml")), Objective::Autoencoding);
  EXPECT_EQ(toToml(plain).find("[train]"), std::string::npos) << "a spec without [train] prints none";

  ModelSpec s = parseSpec(base("tta", "[train]\noptimizer = \"sgd\"\nlr = 0.5\nbetas = [0.8, 0.99]\n"
                                      "schedule = \"cosine\"\nwarmup_steps = 3\nsteps = 10\nlabel_smoothing = 0.1\n"
                                      "mask_replace = \"bert\"\nseed = 7\n"),
                          "t.toml");
  EXPECT_TRUE(s.trainGiven);
  EXPECT_EQ(s.train.optimizer, OptimizerKind::SGD);
  EXPECT_DOUBLE_EQ(s.train.lr, 0.5);
  EXPECT_DOUBLE_EQ(s.train.beta1, 0.8);
  EXPECT_DOUBLE_EQ(s.train.beta2, 0.99);
  EXPECT_EQ(s.train.schedule, Schedule::Cosine);
  EXPECT_EQ(s.train.warmupSteps, 3);
  EXPECT_DOUBLE_EQ(s.train.labelSmoothing, 0.1);
  EXPECT_EQ(s.train.maskReplace, MaskReplace::Bert);
  EXPECT_EQ(s.train.seed, 7);
  ModelSpec again = parseSpec(toToml(s), "resolved.toml");
  EXPECT_EQ(specHash(again), specHash(s));
  EXPECT_DOUBLE_EQ(again.train.beta2, 0.99);
  EXPECT_NE(specHash(s), specHash(parseSpec(base("tta"), "t.toml")));
}

TEST(SpecErrors, Train) {
  EXPECT_NE(errorOf(base("tta", "[train]\nlr = -1\n")).find("'train.lr'"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[train]\nbetas = [0.9]\n")).find("'train.betas'"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[train]\nbetas = [0.9, 1.0]\n")).find("'train.betas'"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[train]\nstep = 3\n")).find("'train.step': unknown key"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[train]\noptimizer = \"lamb\"\n")).find("'train.optimizer'"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[train]\nobjective = \"causal\"\n")).find("'train.objective'"), std::string::npos);
  EXPECT_NE(errorOf(base("bilm", "[train]\nobjective = \"autoencoding\"\n")).find("'train.objective'"),
            std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[train]\ndropout = 1.0\n")).find("'train.dropout'"), std::string::npos);
  EXPECT_NE(errorOf(base("tta", "[train]\nsteps = 0\n")).find("'train.steps'"), std::string::npos);
}

TEST(Spec, TextTables) {
  ModelSpec s = parseSpec(base("bilm", "[head]\nmlm = false\n[embed]\npool = \"cls\"\nnormalize = true\n"
                                       "[tokenizer]\nvocab = \"v/vocab.txt\"\nlowercase = false\nbos = \"[CLS]\"\n"),
                          "dir/t.toml");
  EXPECT_FALSE(s.mlm);
  EXPECT_EQ(s.pool, Pooling::Cls);
  EXPECT_TRUE(s.normalize);
  ASSERT_TRUE(s.tokenizer.has_value());
  EXPECT_EQ(s.tokenizer->vocab, "v/vocab.txt");
  EXPECT_EQ(s.tokenizer->vocabPath, "dir/v/vocab.txt"); // relative to the spec
  EXPECT_FALSE(s.tokenizer->lowercase);
  EXPECT_EQ(s.tokenizer->bos, "[CLS]");
  EXPECT_EQ(s.where("head.mlm"), "dir/t.toml:11:7");
  // The resolved spec round-trips (the hash too), and holds the tables.
  ModelSpec again = parseSpec(toToml(s), "dir/t.toml");
  EXPECT_EQ(specHash(s), specHash(again));
  EXPECT_NE(toToml(s).find("[embed]\npool = \"cls\"\nnormalize = true\n"), std::string::npos) << toToml(s);
  // Defaults given explicitly add nothing: the hash of a spec without the new tables is unchanged.
  EXPECT_EQ(specHash(parseSpec(base("bilm", "[head]\nmlm = true\n[embed]\npool = \"mean\"\nnormalize = false\n"), "a")),
            specHash(parseSpec(base("bilm"), "a")));
  EXPECT_EQ(toJson(parseSpec(base("bilm", "[embed]\npool = \"mean\"\n"), "a")), toJson(parseSpec(base("bilm"), "a")));
  EXPECT_NE(specHash(parseSpec(base("bilm", "[embed]\npool = \"mean_all\"\n"), "a")),
            specHash(parseSpec(base("bilm"), "a")));
}

TEST(SpecErrors, TextTables) {
  EXPECT_EQ(errorOf(base("bilm", "[embed]\npool = \"max\"\n")),
            "t.toml:11:8: error: 'embed.pool': unknown value \"max\"; valid values are \"mean\", \"mean_all\", \"cls\"");
  EXPECT_EQ(errorOf(base("bilm", "[tokenizer]\nlowercase = true\n")),
            "t.toml:10:1: error: 'tokenizer.vocab': missing required key: the WordPiece vocabulary file (one token a "
            "line, relative to the spec)");
  EXPECT_EQ(errorOf(base("bilm", "[tokenizer]\nvocab = \"\"\n")), "t.toml:11:9: error: 'tokenizer.vocab': must not be empty");
  EXPECT_EQ(errorOf(base("bilm", "[tokenizer]\nvocab = \"v\"\ncase = 1\n")).substr(0, 42),
            "t.toml:12:1: error: 'tokenizer.case': unkn");
  EXPECT_EQ(errorOf(base("ngram", "[head]\nmlm = false\n")),
            "t.toml:11:7: error: 'head.mlm': family \"ngram\" needs its output head; mlm = false applies to unilm, "
            "bilm and tta");
}
