// RUN: lmcc emit-mlir %inputs/specs/tiny_tta.toml | lmcc-opt --lm-fuse-attention --lm-fold-constants | FileCheck %s
// T-TA's first query norm(P) and its first-layer projection depend only on weights
// and positions: they move into private lm.fold functions evaluated at load time,
// and the program reads their rows.

// CHECK-LABEL: func.func @score
// CHECK-DAG: [[H:%.+]] = lm.folded_rows %arg0 {table = @[[HFOLD:fold_[0-9]+]]} : (tensor<?x?xi32>) -> tensor<?x?x30xf32>
// CHECK-DAG: [[Q:%.+]] = lm.folded_rows %arg0 {table = @[[QFOLD:fold_[0-9]+]]} : (tensor<?x?xi32>) -> tensor<?x?x30xf32>
// CHECK: lm.attention [[Q]],
// CHECK: lm.add [[H]],
// CHECK-NOT: lm.folded_rows
// CHECK-LABEL: func.func @embed
// CHECK: func.func private @[[QFOLD]](%arg0: tensor<?x?xi32>) -> tensor<?x?x30xf32> attributes {lm.fold}
// CHECK: lm.positions %arg0 table
// CHECK: lm.layer_norm
// CHECK: lm.weight "layers.0.attn.q.weight"
// CHECK: lm.linear
// CHECK: func.func private @[[HFOLD]](%arg0: tensor<?x?xi32>) -> tensor<?x?x30xf32> attributes {lm.fold}
// CHECK: lm.positions %arg0 table
// CHECK: [[N:%.+]] = lm.layer_norm
// CHECK-NEXT: return [[N]]
