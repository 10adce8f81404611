//===- Eval.h - lmcc sts, blimp, rerank -----------------------------------===//
//
// Evaluation commands over a model (compiled or --reference), streaming their input in bounded chunks:
//   sts:    cosine similarity of the two sentences' embeddings against STS-B gold scores (Pearson, Spearman)
//   blimp:  share of BLiMP minimal pairs whose good sentence scores higher than the bad one
//   rerank: n-best rescoring am + lambda * lm (+ P * words), WER before and after, lambda tuned on a dev set
//
//===----------------------------------------------------------------------===//
#pragma once

#include "tools/lmcc/Common.h"

namespace lmcc::cli {

int runSts(const Options &o);
int runBlimp(const Options &o);
int runRerank(const Options &o);

} // namespace lmcc::cli
