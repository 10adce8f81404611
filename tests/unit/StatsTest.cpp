// FLOP and temporary-memory counts read off lm IR (codegen/Stats.h): closed forms
// for the T-TA paper configuration and its mask-and-predict biLM twin, invariance
// of the FLOPs under the fusion passes, the [n, V] term that lm-fuse-logprob
// removes from the temporaries, and exact counts on hand-written IR.
#include "codegen/Stats.h"
#include "frontend/MLIRGen.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

using namespace lmcc;
using lmcc::codegen::countStats;
using lmcc::codegen::EntryStats;

namespace {

/// The T-TA paper's configuration: vocab 30522, max_len 128, d 512, 8 heads, FFN 2048, 3 layers.
ModelSpec ttaPaper() {
  ModelSpec s; // the struct's defaults are T-TA's (diagonal mask, input isolation, position queries)
  s.name = "tta_paper";
  s.family = Family::TTA;
  s.dims = Dims{30522, 128, 512, 8, 2048, 3};
  return s;
}

/// A BERT-style masked LM of the same size, scored by mask-and-predict.
ModelSpec bilmPaper() {
  ModelSpec s = ttaPaper();
  s.name = "bilm_paper";
  s.family = Family::BiLM;
  s.mask = MaskKind::None, s.keysValues = KeyValueSource::Hidden, s.firstQuery = FirstQuery::Embedding;
  s.method = ScoreMethod::MaskAndPredict;
  return s;
}

ModelSpec unilmRelative() {
  ModelSpec s = ttaPaper();
  s.name = "unilm_rel";
  s.family = Family::UniLM;
  s.dims = Dims{101, 32, 48, 4, 96, 2};
  s.mask = MaskKind::Causal, s.keysValues = KeyValueSource::Hidden, s.firstQuery = FirstQuery::Embedding;
  s.method = ScoreMethod::Causal;
  s.relativePositions = 3, s.norm = NormPlacement::Pre, s.tied = false;
  return s;
}

ModelSpec diformer() {
  ModelSpec s = ttaPaper();
  s.name = "diformer_small";
  s.family = Family::Diformer;
  s.dims = Dims{97, 40, 64, 4, 128, 2};
  s.mask = MaskKind::Directional, s.keysValues = KeyValueSource::Embedding, s.firstQuery = FirstQuery::Position;
  s.method = ScoreMethod::Causal;
  s.relativePositions = 4;
  s.diformer = DiformerOptions{StackDims{2, 4, 128}, StackDims{1, 2, 96}};
  return s;
}

ModelSpec ngram() {
  ModelSpec s = unilmRelative();
  s.name = "ngram_small";
  s.family = Family::NGram;
  s.relativePositions = 0;
  s.ngram = NGramOptions{};
  return s;
}

std::map<std::string, EntryStats> byEntry(mlir::ModuleOp module, int64_t n) {
  std::map<std::string, EntryStats> out;
  for (const EntryStats &s : countStats(module, n))
    out[s.entry] = s;
  return out;
}

bool inPipeline(const std::string &flag) {
  const auto &passes = defaultPipeline();
  return std::find(passes.begin(), passes.end(), flag) != passes.end();
}

/// Runs the passes of the default pipeline named in `only` on `module`.
void optimize(mlir::ModuleOp module, const std::set<std::string> &only = {"lm-fuse-attention", "lm-fuse-logprob"}) {
  std::set<std::string> disabled;
  for (const std::string &flag : defaultPipeline())
    if (!only.count(flag))
      disabled.insert(flag);
  mlir::PassManager pm(module.getContext());
  addOptimizationPasses(pm, disabled);
  ASSERT_TRUE(mlir::succeeded(pm.run(module)));
}

int64_t countOps(mlir::ModuleOp module, llvm::StringRef name) {
  int64_t count = 0;
  module.walk([&](mlir::Operation *op) { count += op->getName().getStringRef() == name; });
  return count;
}

/// Matrix-product FLOPs of one forward pass of the T-TA-shaped stack over n tokens
/// (no output head): per layer the q, k, v, o projections, the FFN, and the
/// attention scores + values products (full n x n, masks not discounted).
int64_t stackFlops(const Dims &d, int64_t n) {
  int64_t D = d.dModel, F = d.dFF;
  int64_t perLayer = 4 * 2 * n * D * D    // q, k, v, o projections
                     + 2 * 2 * n * D * F  // FFN in and out
                     + 2 * 2 * n * n * D; // Q K^T and P V over all heads
  return d.layers * perLayer;
}

/// The output head: transform (dense D x D) + vocabulary projection.
int64_t headFlops(const Dims &d, int64_t n) { return 2 * n * d.dModel * d.dModel + 2 * n * d.dModel * d.vocab; }

TEST(StatsTest, TTAPaperScoreFlopsClosedForm) {
  mlir::MLIRContext ctx;
  ModelSpec spec = ttaPaper();
  auto module = buildModule(ctx, spec);
  ASSERT_TRUE(module);
  const int64_t n = 20;
  auto stats = byEntry(*module, n);
  ASSERT_EQ(stats.size(), 3u);
  int64_t expected = stackFlops(spec.dims, n) + headFlops(spec.dims, n);
  EXPECT_EQ(stats["score"].flops, expected);
  EXPECT_EQ(stats["score"].flops, 1015521280); // 1.02 GFLOP at n = 20
  EXPECT_EQ(stats["logits"].flops, expected);
  EXPECT_EQ(stats["embed"].flops, stackFlops(spec.dims, n));
  // The flops of one sentence grow with n (linear terms) and n^2 (attention).
  EXPECT_EQ(byEntry(*module, 40)["score"].flops, stackFlops(spec.dims, 40) + headFlops(spec.dims, 40));
}

TEST(StatsTest, BiLMIsNTimesTheSinglePass) {
  mlir::MLIRContext ctx;
  ModelSpec spec = bilmPaper();
  auto module = buildModule(ctx, spec);
  ASSERT_TRUE(module);
  for (int64_t n : {1, 7, 20}) {
    auto stats = byEntry(*module, n);
    // Mask-and-predict: n forward passes, each of the T-TA closed form.
    EXPECT_EQ(stats["score"].flops, n * (stackFlops(spec.dims, n) + headFlops(spec.dims, n))) << "n = " << n;
    EXPECT_EQ(stats["embed"].flops, n * stackFlops(spec.dims, n)) << "n = " << n;
    // logits is one pass (no mask-and-predict).
    EXPECT_EQ(stats["logits"].flops, stackFlops(spec.dims, n) + headFlops(spec.dims, n)) << "n = " << n;
  }
  mlir::MLIRContext tctx;
  auto tta = buildModule(tctx, ttaPaper());
  EXPECT_EQ(byEntry(*module, 20)["score"].flops, 20 * byEntry(*tta, 20)["score"].flops);
  EXPECT_EQ(byEntry(*module, 20)["score"].flops, 20310425600); // 20.3 GFLOP
}

TEST(StatsTest, FlopsInvariantUnderFusion) {
  for (const ModelSpec &spec : {ttaPaper(), bilmPaper(), unilmRelative(), diformer(), ngram()}) {
    SCOPED_TRACE(spec.name);
    mlir::MLIRContext ctx;
    auto module = buildModule(ctx, spec);
    ASSERT_TRUE(module);
    std::map<int64_t, std::map<std::string, EntryStats>> naive;
    for (int64_t n : {1, 5, 20})
      naive[n] = byEntry(*module, n);
    int64_t softmaxes = countOps(*module, "lm.softmax");
    // Built fused by MLIRGen: the Diformer step's single-query rows (no decomposed form).
    int64_t fusedAlready = countOps(*module, "lm.attention");
    optimize(*module);
    // The passes did fire: every attention is fused, every gathered head too.
    EXPECT_GT(softmaxes, 0);
    EXPECT_EQ(countOps(*module, "lm.softmax"), 0);
    EXPECT_EQ(countOps(*module, "lm.attention"), softmaxes + fusedAlready);
    EXPECT_GT(countOps(*module, "lm.token_logprob"), 0);
    EXPECT_EQ(countOps(*module, "lm.gather"), 0);
    for (int64_t n : {1, 5, 20}) {
      auto fused = byEntry(*module, n);
      ASSERT_EQ(fused.size(), naive[n].size());
      for (auto &[entry, s] : naive[n]) {
        EXPECT_GT(s.flops, 0) << entry;
        EXPECT_EQ(fused[entry].flops, s.flops) << entry << " at n = " << n;
        // Fusion never needs more temporaries.
        EXPECT_LE(fused[entry].tempBytes, s.tempBytes) << entry << " at n = " << n;
      }
    }
  }
}

TEST(StatsTest, FusedLogprobHasNoNTimesVocabTemporary) {
  for (const ModelSpec &spec : {ttaPaper(), bilmPaper()}) {
    SCOPED_TRACE(spec.name);
    const int64_t V = spec.dims.vocab, n1 = 20, n2 = 40;
    mlir::MLIRContext ctx;
    auto module = buildModule(ctx, spec);
    ASSERT_TRUE(module);
    int64_t naive1 = byEntry(*module, n1)["score"].tempBytes, naive2 = byEntry(*module, n2)["score"].tempBytes;
    optimize(*module, {"lm-fuse-logprob"});
    EXPECT_EQ(countOps(*module, "lm.log_softmax"), 0);
    int64_t fused1 = byEntry(*module, n1)["score"].tempBytes, fused2 = byEntry(*module, n2)["score"].tempBytes;
    // Naive: logits and log-probs [n, V] are both live at the peak, so the peak holds
    // >= 2 n V floats. Fused: no [n, V] tensor at all.
    EXPECT_GE(naive1, 2 * n1 * V * 4);
    EXPECT_LT(fused2, n2 * V * 4);
    EXPECT_GT(fused1, 0);
    EXPECT_GE((naive2 - naive1) - (fused2 - fused1), (n2 - n1) * V * 4)
        << "naive " << naive1 << " -> " << naive2 << ", fused " << fused1 << " -> " << fused2;
  }
}

// lm-batch-mask-predict turns the n passes of mask-and-predict into one pass over n
// copies (lm.masked_batch, whose body's batch is n): the same FLOPs, now counted by
// the ops themselves. lm-prune-rows then computes only the kept rows: fewer.
TEST(StatsTest, BatchedMaskAndPredictCountsItsCopies) {
  if (!inPipeline("lm-batch-mask-predict"))
    GTEST_SKIP() << "lm-batch-mask-predict is not in the pipeline";
  ModelSpec spec = bilmPaper();
  const int64_t n = 20;
  mlir::MLIRContext ctx;
  auto module = buildModule(ctx, spec);
  ASSERT_TRUE(module);
  optimize(*module);
  auto fused = byEntry(*module, n);
  optimize(*module, {"lm-batch-mask-predict"});
  ASSERT_EQ(countOps(*module, "lm.mask_and_predict"), 0);
  ASSERT_GT(countOps(*module, "lm.masked_batch"), 0);
  auto batched = byEntry(*module, n);
  for (auto &[entry, s] : fused)
    EXPECT_EQ(batched[entry].flops, s.flops) << entry;
  EXPECT_EQ(batched["score"].flops, n * (stackFlops(spec.dims, n) + headFlops(spec.dims, n)));
  // All n copies' temporaries are live at once now: more memory than one iteration.
  EXPECT_GT(batched["score"].tempBytes, fused["score"].tempBytes);

  if (!inPipeline("lm-prune-rows"))
    return;
  optimize(*module, {"lm-prune-rows"});
  auto pruned = byEntry(*module, n);
  // The head runs on the n kept rows instead of n^2: of the n head passes over n rows,
  // n - 1 are saved (less one for slack: kept rows that are recomputed on their own).
  EXPECT_LT(pruned["score"].flops, batched["score"].flops - (n - 2) * headFlops(spec.dims, n));
}

/// Parses `text` as an lm module.
mlir::OwningOpRef<mlir::ModuleOp> parse(mlir::MLIRContext &ctx, const char *text) {
  loadLmDialects(ctx);
  return mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
}

/// Two [n, 8] x [8, 8] products with a GELU between them.
const std::string kChain = R"mlir(
func.func @chain(%x: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> {
  %W = lm.weight "w" : tensor<8x8xf32>
  %a = lm.linear %x, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %b = lm.gelu %a : tensor<?x?x8xf32>
  %c = lm.linear %b, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  return %c : tensor<?x?x8xf32>
}
)mlir";

TEST(StatsTest, HandWrittenCounts) {
  mlir::MLIRContext ctx;
  auto module = parse(ctx, (kChain + R"mlir(
func.func @heads(%q: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %qh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %unused = lm.softmax %s : tensor<?x2x?x?xf32>
  %c = lm.matmul %s, %qh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  %a = lm.attention %q, %q, %q, %len {heads = 2 : i64, mask = #lm.mask<causal>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  %y = lm.add %r, %a : tensor<?x?x8xf32>
  return %y : tensor<?x?x8xf32>
}
func.func @pll(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x8xf32> {
  %E = lm.weight "e" : tensor<11x8xf32>
  %W = lm.weight "w" : tensor<8x8xf32>
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?x8xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %h = lm.linear %x, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    lm.yield %h : tensor<?x?x8xf32>
  }
  %e = lm.mean_pool %r, %ids, %len {exclude = array<i32: 3>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
  return %e : tensor<?x8xf32>
}
)mlir").c_str());
  ASSERT_TRUE(module);
  const int64_t n = 5;
  auto stats = countStats(*module, n);
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[0].entry, "chain");
  EXPECT_EQ(stats[1].entry, "heads");
  EXPECT_EQ(stats[2].entry, "pll");

  // chain: two [n, 8] x [8, 8] products. %a (32n bytes) and %b (32n) are live together;
  // %c is returned (an output), %W a weight, %x an input.
  EXPECT_EQ(stats[0].flops, 2 * (2 * n * 8 * 8));
  EXPECT_EQ(stats[0].tempBytes, 2 * 32 * n);

  // heads: Q K^T = 2 * (2 n n) * 4, P V = 2 * (2 n 4) * n, the fused op 4 * n * n * 8.
  EXPECT_EQ(stats[1].flops, 2 * 2 * n * n * 4 + 2 * 2 * n * 4 * n + 4 * n * n * 8);
  // Peak at the unused softmax: qh (2 n 4 floats) + s (2 n n floats) + the dead
  // softmax result (2 n n floats, freed at once); %y is returned.
  int64_t qh = 4 * 2 * n * 4, s = 4 * 2 * n * n;
  EXPECT_EQ(stats[1].tempBytes, qh + s + s);

  // pll: one [n, 8] x [8, 8] product per position.
  EXPECT_EQ(stats[2].flops, n * (2 * n * 8 * 8));
  // At the mask_and_predict: its result (32n) + one iteration's peak: the masked ids
  // (4n, dead after the embed) are gone when the linear allocates, so the body peaks
  // at x + h = 64n. The pooled embedding is returned.
  EXPECT_EQ(stats[2].tempBytes, 32 * n + 64 * n);
}

// The runtime's memory model of a library whose GEMMs run on AMX tiles counts each product's input rounded to bf16
// pairs while the product runs: rows padded to 32, ceil(K / 32) * 16 four-byte words per row. lm.token_logprob's
// own temporaries (its per-row partials and logits scratch) count with any GEMM.
TEST(StatsTest, MemoryModelCountsAmxInputCopies) {
  mlir::MLIRContext ctx;
  auto module = parse(ctx, (kChain + R"mlir(
func.func @logprob(%h: tensor<?x?x40xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "e" : tensor<11x40xf32>
  %t = lm.token_logprob %h, %E, %ids, %len : (tensor<?x?x40xf32>, tensor<11x40xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %t : tensor<?x?xf32>
}
)mlir").c_str());
  ASSERT_TRUE(module);
  // Every allocation asks for its bytes and 64 more (the pointer aligned to 64 within them).
  auto up = [](int64_t bytes) { return bytes + 64; };
  for (int64_t n : {5, 40}) {
    const int64_t paddedRows = n <= 32 ? 32 : 64;
    auto plain = codegen::memoryModel(*module, "chain", n), amx = codegen::memoryModel(*module, "chain", n, true);
    ASSERT_EQ(amx.perSentence.size(), size_t(n + 1));
    // Without copies: %a and %b live together at the gelu. With them: at the second linear, %b, its result %c (a
    // returned value is a buffer of its own until the return copies it out) and the copy of its input (K = 8: 16
    // words, 64 bytes a row).
    EXPECT_EQ(plain.perSentence[n], 2 * up(32 * n));
    EXPECT_EQ(amx.perSentence[n], 2 * up(32 * n) + up(paddedRows * 64)) << "n " << n;
    EXPECT_EQ(amx.perCopy[n], 0) << "no masked batch: nothing per copy";
    // token_logprob: its result (returned, so copied out at the end), its own temporaries (V = 11: per row one
    // chunk's max, f32, and exponential sum, f64, the target's logit, f32, and a row of logits 16 wide) and the
    // copy of the hidden states (K = 40: 2 steps of 16 words).
    const int64_t own = up(4 * n) + up(4 * n) + up(8 * n) + up(4 * n) + up(16 * 4 * n);
    EXPECT_EQ(codegen::memoryModel(*module, "logprob", n).perSentence[n], own);
    EXPECT_EQ(codegen::memoryModel(*module, "logprob", n, true).perSentence[n], own + up(paddedRows * 32 * 4))
        << "n " << n;
  }
}

// The memory model's thread term: what one more thread's work item holds at once, for sentences of at most n tokens
// -- an lm.attention task's scratch (head size 16: keys transposed and values packed, [M16, 16] each, and a tile's
// scores [8, M16]; M16 = n rounded up to 16), an lm.token_logprob item's logits with the generated GEMM ([128, 16]
// here: V = 11 rounded up to 16); nothing for products and element-wise ops.
TEST(StatsTest, MemoryModelThreadTerm) {
  mlir::MLIRContext ctx;
  auto module = parse(ctx, (kChain + R"mlir(
func.func @both(%h: tensor<?x?x32xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %a = lm.attention %h, %h, %h, %len {heads = 2 : i64, mask = #lm.mask<none>, scale = 2.500000e-01 : f32} : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>
  %E = lm.weight "e" : tensor<11x32xf32>
  %t = lm.token_logprob %a, %E, %ids, %len : (tensor<?x?x32xf32>, tensor<11x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %t : tensor<?x?xf32>
}
)mlir").c_str());
  ASSERT_TRUE(module);
  auto up = [](int64_t bytes) { return bytes + 64; };
  const int64_t maxLen = 40;
  auto chain = codegen::memoryModel(*module, "chain", maxLen);
  ASSERT_EQ(chain.perThread.size(), size_t(maxLen + 1));
  EXPECT_EQ(*std::max_element(chain.perThread.begin(), chain.perThread.end()), 0);
  auto generated = codegen::memoryModel(*module, "both", maxLen);
  auto eigen = codegen::memoryModel(*module, "both", maxLen, /*amxCopies=*/false, /*generatedGemm=*/false);
  const int64_t logits = up(128 * 16 * 4);
  for (int64_t n = 1; n <= maxLen; ++n) {
    const int64_t M16 = (n + 15) / 16 * 16, attention = 2 * up(M16 * 16 * 4) + up(8 * M16 * 4);
    EXPECT_EQ(generated.perThread[n], std::max(attention, logits)) << "n " << n;
    EXPECT_EQ(eigen.perThread[n], attention) << "n " << n << ": the runtime's GEMM writes one buffer of the op";
  }
}

TEST(StatsTest, DynamicDimsRule) {
  mlir::MLIRContext ctx;
  loadLmDialects(ctx);
  auto f32 = mlir::Float32Type::get(&ctx);
  auto dyn = mlir::ShapedType::kDynamic;
  // The first ? is the batch (1), every further ? is n.
  EXPECT_EQ(codegen::tensorBytes(mlir::RankedTensorType::get({dyn, 8, dyn, dyn}, f32), 10), 4 * 8 * 10 * 10);
  EXPECT_EQ(codegen::tensorBytes(mlir::RankedTensorType::get({dyn}, f32), 10), 4);
  EXPECT_EQ(codegen::tensorBytes(mlir::RankedTensorType::get({dyn, 512}, f32), 10), 4 * 512);
  EXPECT_EQ(codegen::tensorBytes(mlir::RankedTensorType::get({dyn, dyn}, mlir::IntegerType::get(&ctx, 32)), 10), 40);
  EXPECT_EQ(codegen::tensorBytes(mlir::RankedTensorType::get({dyn, dyn, dyn}, mlir::IntegerType::get(&ctx, 1)), 3), 9);
}

/// The T-TA paper's configuration as a biLM spec file would give it: the family's
/// defaults (no mask, keys/values from the hidden states, mask-and-predict scoring)
/// filled in by the spec parser, not by hand.
ModelSpec paperBiLMFromToml(int64_t vocab = 30522) {
  return parseSpec("name = \"bilm_paper\"\nfamily = \"bilm\"\n[dims]\nvocab = " + std::to_string(vocab) +
                       "\nmax_len = 128\nd_model = 512\nheads = 8\nd_ff = 2048\nlayers = 3\n",
                   "<acceptance>");
}

/// Score-entry FLOPs of a post-norm BERT-style biLM under the default pipeline, n
/// tokens, one sentence (n masked copies): lm-share-first-layer computes the first
/// layer's Q/K/V on 2n rows (the sentence and all-[MASK]); every layer but the last
/// runs the rest on the n copies of n rows; lm-prune-rows leaves the last layer
/// with K/V on all n^2 rows but Q, one query per copy, O and the FFN on n rows,
/// and the head (transform + vocabulary) on n rows.
int64_t pipelineBiLMScoreFlops(const Dims &d, int64_t n) {
  int64_t D = d.dModel, F = d.dFF, L = d.layers, rows = n * n;
  int64_t sharedQKV = 3 * 2 * (2 * n) * D * D;
  int64_t copyLayerRest = 2 * rows * D * D + 2 * 2 * rows * D * F + 4 * n * n * n * D; // O, FFN, attention
  int64_t copyLayerQKV = 3 * 2 * rows * D * D;
  int64_t lastLayer = 2 * 2 * rows * D * D                         // K, V on every row of every copy
                      + 2 * 2 * n * D * D + 2 * 2 * n * D * F      // Q, O, FFN on the kept rows
                      + 4 * n * n * D;                             // one query per copy against n keys
  return sharedQKV + copyLayerRest + (L - 2) * (copyLayerQKV + copyLayerRest) + lastLayer + headFlops(d, n);
}

/// Runs the full default pipeline, as `lmcc compile` does without --no-<pass>.
void runDefaultPipeline(mlir::ModuleOp module) {
  mlir::PassManager pm(module.getContext());
  addOptimizationPasses(pm, {});
  ASSERT_TRUE(mlir::succeeded(pm.run(module)));
}

// Acceptance: on the T-TA paper's biLM (vocab 30522, max_len 128, d 512, 8 heads,
// FFN 2048, 3 layers) at n = 20, the default pipeline scores a sentence with at
// least 3.4x fewer FLOPs than the naive n forward passes, and its temporaries have
// no n x V term.
TEST(StatsTest, AcceptancePaperBiLMDefaultPipeline) {
  ModelSpec spec = paperBiLMFromToml();
  ASSERT_EQ(spec.method, ScoreMethod::MaskAndPredict);
  ASSERT_EQ(spec.mask, MaskKind::None);
  const int64_t V = spec.dims.vocab, n1 = 20, n2 = 40;
  mlir::MLIRContext ctx;
  auto module = buildModule(ctx, spec);
  ASSERT_TRUE(module);
  auto naive1 = byEntry(*module, n1), naive2 = byEntry(*module, n2);
  runDefaultPipeline(*module);
  EXPECT_EQ(countOps(*module, "lm.mask_and_predict"), 0);
  auto opt1 = byEntry(*module, n1), opt2 = byEntry(*module, n2);

  // FLOPs: 20.3 GFLOP naive (n times the single pass) against 5.66 GFLOP. The
  // all-[MASK] first-layer projections depend on positions and weights only, so a
  // load-time fold may take them out of the per-call count: allow exactly that much.
  EXPECT_EQ(naive1["score"].flops, n1 * (stackFlops(spec.dims, n1) + headFlops(spec.dims, n1)));
  for (int64_t n : {n1, n2}) {
    int64_t expected = pipelineBiLMScoreFlops(spec.dims, n), maskedQKV = 3 * 2 * n * spec.dims.dModel * spec.dims.dModel;
    int64_t got = (n == n1 ? opt1 : opt2)["score"].flops;
    EXPECT_LE(got, expected) << "n = " << n;
    EXPECT_GE(got, expected - maskedQKV) << "n = " << n;
  }
  EXPECT_EQ(pipelineBiLMScoreFlops(spec.dims, n1), 5660385280);
  double speedup = double(naive1["score"].flops) / double(opt1["score"].flops);
  EXPECT_GE(speedup, 3.4) << "naive " << naive1["score"].flops << ", optimized " << opt1["score"].flops;
  // @embed (the same batch without the head) gains too; @logits is one pass either way.
  EXPECT_LT(opt1["embed"].flops, naive1["embed"].flops);
  EXPECT_EQ(opt1["logits"].flops, naive1["logits"].flops);

  // Temporaries. Naive: every iteration holds [n, V] logits and log-probs, so going
  // from n = 20 to 40 adds more than (40 - 20) V floats.
  const int64_t nV = (n2 - n1) * V * 4;
  int64_t naiveGrowth = naive2["score"].tempBytes - naive1["score"].tempBytes;
  int64_t optGrowth = opt2["score"].tempBytes - opt1["score"].tempBytes;
  EXPECT_GT(naiveGrowth, nV);
  // Optimized: the growth does not depend on V. (It is not below (40 - 20) V floats
  // in absolute terms: the batched body holds n copies x n rows x d_ff, an n^2 d_ff
  // term, 13 MB at n = 40.) The same model with half the vocabulary grows by the
  // same amount up to far less than one [n, dV] tensor; naive differs by two.
  const int64_t V0 = V / 2, ndV = (n2 - n1) * (V - V0) * 4;
  mlir::MLIRContext ctx0;
  auto small = buildModule(ctx0, paperBiLMFromToml(V0));
  ASSERT_TRUE(small);
  int64_t naiveGrowth0 = byEntry(*small, n2)["score"].tempBytes - byEntry(*small, n1)["score"].tempBytes;
  runDefaultPipeline(*small);
  int64_t optGrowth0 = byEntry(*small, n2)["score"].tempBytes - byEntry(*small, n1)["score"].tempBytes;
  EXPECT_GE(naiveGrowth - naiveGrowth0, ndV) << "naive " << naiveGrowth0 << " -> " << naiveGrowth;
  EXPECT_LT(std::abs(optGrowth - optGrowth0), ndV / 4) << "optimized " << optGrowth0 << " -> " << optGrowth;
}

} // namespace
