//===- NGram.h - Reference ops of the n-gram heads (issue 18) -------------===//
//
// The numeric definition of the ngram family's extra ops (dialect/LmOps.td, "N-gram heads"), in the
// layout of Ops.h. The reference composes them literally as the contract states: each head's logits
// z_j = W u_j + b, the ensemble mixed in logit space (the compiled pipeline mixes the vectors and
// projects once; the two agree because the weights sum to 1).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/reference/Ops.h"

namespace lmcc::reference {

/// lm.wdr_conjugate: out[b, s] = sum_{i=1..j-1, s+j-i < L_b} (-1)^(i+1) C(j-1, i) table[ids[b, s+j-i]]
/// (float, in order of i); [B, 1, N, D] with the lengths of ids. No backward: it is the stop-gradient.
Batch wdrConjugate(const Matrix &table, const TokenBatch &ids, int64_t head);

/// The contract's logit-space ensemble: z [n] heads' logits [B, 1, N, V]; row p (1 <= p < L_b) is
/// (1-lambda) z_1[p-1] + lambda/(n-1) sum_{j=2..n} (p >= j ? z_j[p-j] : z_1[p-1]) (in double, rounded
/// once); row 0 is 0. Row p predicts x_p.
Batch ngramEnsembleLogits(const std::vector<Batch> &z, double lambda);

/// Head j's targets: y[b, s] = targets[b, s + shift] while s + shift < L_b, else -1.
TokenBatch shiftTargets(const TokenBatch &targets, int64_t shift);

/// The objective's weight of head j (1-based) of n: 1/2 for j = 1, 1/(2(n-1)) otherwise.
inline double ngramHeadWeight(int64_t j, int64_t n) { return j == 1 ? 0.5 : 0.5 / double(n - 1); }

} // namespace lmcc::reference
