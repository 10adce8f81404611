// RUN: lmcc emit-mlir %models/diformer_base.toml | lmcc-opt | FileCheck %s
// Diformer: encoder over the source; decoder queries from direction + position,
// self-attention over target word embeddings with a per-token directional mask and
// Shaw relative positions (k = 16), then cross-attention to the encoder.

// CHECK-LABEL: func.func @score(%arg0: tensor<?x?xi32>, %arg1: tensor<?xi32>, %arg2: tensor<?x?xi32>, %arg3: tensor<?xi32>, %arg4: tensor<?x?xi32>)
// CHECK: lm.weight "encoder.layers.5.ffn_norm.weight"
// CHECK: [[W:%.+]] = lm.embed {{.*}}[%arg2]
// CHECK: lm.weight "decoder.direction" : tensor<3x512xf32>
// CHECK: lm.embed {{.*}}[%arg4]
// CHECK: lm.linear [[W]]
// CHECK: lm.relative_scores {{.*}} {clip = 16 : i64}
// CHECK: lm.mask_fill {{.*}}, %arg3 data(%arg4 : tensor<?x?xi32>) {mask = #lm.mask<directional>}
// CHECK: lm.relative_values
// CHECK: lm.weight "decoder.layers.0.cross.q.weight"
// CHECK: lm.mask_fill {{.*}}, %arg1 {mask = #lm.mask<none>}
// CHECK: lm.sentence_score
