// RUN: lmcc emit-mlir %models/tta_mask_base.toml | lmcc-opt | FileCheck %s
// T-TA as the official code builds the first query: norm(E[MASK] + P).

// CHECK-LABEL: func.func @score
// CHECK: [[POS:%.+]] = lm.positions
// CHECK: [[M:%.+]] = lm.fill_ids %arg0 {value = 4 : i64}
// CHECK: [[ME:%.+]] = lm.embed {{.*}}[[[M]]]
// CHECK: [[S:%.+]] = lm.add [[ME]], [[POS]]
// CHECK: lm.layer_norm [[S]]
