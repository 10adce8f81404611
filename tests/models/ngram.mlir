// RUN: lmcc emit-mlir %models/ngram_clm.toml | lmcc-opt | FileCheck %s
// N-gram CLM: pre-norm causal stack, an extra head predicting x_{t+2}, mixed into
// the next-token log-probs with lambda.

// CHECK-LABEL: func.func @score
// CHECK: lm.mask_fill {{.*}}#lm.mask<causal>
// CHECK: lm.weight "final_norm.weight"
// CHECK: [[MAIN:%.+]] = lm.gather {{.*}} {shift = 1 : i64}
// CHECK: lm.weight "ngram.heads.2.in.weight"
// CHECK: [[EXTRA:%.+]] = lm.gather {{.*}} {shift = 2 : i64}
// CHECK: lm.interpolate [[MAIN]], [[EXTRA]] {from = 2 : i64, lambda = 4.000000e-01 : f64}
