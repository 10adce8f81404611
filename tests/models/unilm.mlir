// RUN: lmcc emit-mlir %models/unilm_base.toml | lmcc-opt | FileCheck %s
// uniLM: causal mask, x_t scored from position t-1, position 0 never scored.

// CHECK-LABEL: func.func @score
// CHECK-SAME: lm.method = "causal"
// CHECK: [[X:%.+]] = lm.layer_norm
// CHECK: lm.linear [[X]]
// CHECK: lm.mask_fill {{.*}}#lm.mask<causal>
// CHECK: lm.gather {{.*}} {shift = 1 : i64}
// CHECK: lm.sentence_score {{.*}}first = 1 : i64
// CHECK-NOT: lm.mask_and_predict
