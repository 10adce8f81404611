// RUN: lmcc emit-mlir %models/bert_base.toml | lmcc-opt | FileCheck %s
// BERT-base: 12 post-norm layers, [MASK] = 103, [CLS]/[SEP] excluded from scores.

// CHECK-LABEL: func.func @score
// CHECK: lm.mask_and_predict {{.*}} {mask_token = 103 : i64}
// CHECK: lm.weight "layers.11.ffn_norm.weight" : tensor<768xf32>
// CHECK: lm.sentence_score {{.*}}skip = array<i32: 101, 102>
