// RUN: lmcc emit-mlir %models/diformer_base.toml | lmcc-opt | FileCheck %s
// Diformer (issue 19's contract): a post-norm encoder over the source and a length head on the mean of its
// output; decoder queries from each row's direction and position (r2l for L rows); self-attention keys and
// values from the target word embeddings alone, Shaw relative positions (k = 16) and the directional mask
// read from the rows operand [B, N, 1 + 8 words of hidden-key bits] (max_len 256); cross-attention to the
// encoder; each row's target from its direction; bos/eos targets scored (skip only -1).

// CHECK-LABEL: func.func @score(%arg0: tensor<?x?xi32>, %arg1: tensor<?xi32>, %arg2: tensor<?x?xi32>, %arg3: tensor<?xi32>, %arg4: tensor<?x?x9xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>, tensor<?xf32>) attributes {lm.method = "pairs"}
// CHECK: lm.weight "encoder.layers.5.ffn_norm.weight"
// CHECK: [[W:%.+]] = lm.embed {{.*}}[%arg2]
// CHECK: lm.weight "decoder.position.r2l" : tensor<256x512xf32>
// CHECK: lm.weight "decoder.direction" : tensor<3x512xf32>
// CHECK: lm.decoder_queries %arg4, %arg3
// CHECK: lm.linear [[W]]
// CHECK: lm.relative_scores {{.*}} {clip = 16 : i64}
// CHECK: lm.mask_fill {{.*}}, %arg3 data(%arg4 : tensor<?x?x9xi32>) {mask = #lm.mask<directional>}
// CHECK: lm.relative_values
// CHECK: lm.weight "decoder.layers.0.cross.q.weight"
// CHECK: lm.mask_fill {{.*}}, %arg1 {mask = #lm.mask<none>}
// CHECK: lm.length_logprob {{.*}}, %arg1, {{.*}}, %arg3 : (tensor<?x?x512xf32>, tensor<?xi32>, tensor<256x512xf32>, tensor<?xi32>) -> tensor<?xf32>
// CHECK: [[TAU:%.+]] = lm.directional_targets %arg2, %arg4, %arg3
// CHECK: lm.gather {{.*}}, [[TAU]], %arg3
// CHECK: lm.sentence_score {{.*}}, [[TAU]], %arg3 {skip = array<i32: -1>}
