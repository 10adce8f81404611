// RUN: lmcc emit-mlir %models/tta_base.toml | lmcc-opt | FileCheck %s
// T-TA: diagonal mask, first query = norm(P), and input isolation: every layer's
// keys and values are projections of the same embedding value X = norm(E[x] + P).

// CHECK-LABEL: func.func @score
// CHECK-SAME: lm.method = "single-pass"
// CHECK: [[TOK:%.+]] = lm.embed
// CHECK: [[POS:%.+]] = lm.positions
// CHECK: [[SUM:%.+]] = lm.add [[TOK]], [[POS]]
// CHECK: [[X:%.+]] = lm.layer_norm [[SUM]]
// CHECK: [[Q0:%.+]] = lm.layer_norm [[POS]]
// CHECK: lm.linear [[Q0]]
// CHECK: lm.weight "layers.0.attn.k.weight"
// CHECK-NEXT: lm.weight "layers.0.attn.k.bias"
// CHECK-NEXT: lm.linear [[X]],
// CHECK: lm.weight "layers.0.attn.v.weight"
// CHECK-NEXT: lm.weight "layers.0.attn.v.bias"
// CHECK-NEXT: lm.linear [[X]],
// CHECK: lm.mask_fill {{.*}}#lm.mask<diagonal>
// CHECK: lm.weight "layers.1.attn.k.weight"
// CHECK-NEXT: lm.weight "layers.1.attn.k.bias"
// CHECK-NEXT: lm.linear [[X]],
// CHECK: lm.weight "layers.2.attn.v.weight"
// CHECK-NEXT: lm.weight "layers.2.attn.v.bias"
// CHECK-NEXT: lm.linear [[X]],
// CHECK: lm.log_softmax
// CHECK: lm.gather %{{[0-9]+}}, %arg0, %arg1 : (tensor<?x?x30522xf32>
// CHECK: lm.sentence_score {{.*}}skip = array<i32: 3, 1>
// CHECK-NOT: lm.mask_and_predict
// CHECK-LABEL: func.func @embed
// CHECK: lm.mean_pool {{.*}}exclude = array<i32: 3, 1>
// CHECK-LABEL: func.func @logits
