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

// The decoders' entries: the encoder once (the whole length distribution and the cross-attention keys/values of
// every decoder layer, one GEMM with the stacked weights), each token's self-attention keys/values once (input
// isolation: they depend on the token alone), a parallel pass over every row and a step whose one query row per
// target sits at positions[b] (fused attention with query positions: single-query rows have no decomposed form),
// both over the cached keys/values [B, T, 2 L D] (layer l's keys at 2lD, its values at 2lD + D).
// CHECK-LABEL: func.func @encode(%arg0: tensor<?x?xi32>, %arg1: tensor<?xi32>) -> (tensor<?x256xf32>, tensor<?x?x6144xf32>) attributes {lm.method = "pair_encode"}
// CHECK: lm.length_logprob {{.*}}, %arg1, {{.*}} : (tensor<?x?x512xf32>, tensor<?xi32>, tensor<256x512xf32>) -> tensor<?x256xf32>
// CHECK: lm.weight "decoder.layers.0.cross.k.weight"
// CHECK-NEXT: lm.weight "decoder.layers.0.cross.k.bias"
// CHECK-NEXT: lm.weight "decoder.layers.0.cross.v.weight"
// CHECK: lm.concat {{.*}} -> tensor<6144x512xf32>
// CHECK-LABEL: func.func @token_kv(%arg0: tensor<?x?xi32>) -> tensor<?x?x6144xf32> attributes {lm.method = "pair_token_kv"}
// CHECK: lm.weight "decoder.layers.0.attn.k.weight"
// CHECK: lm.linear {{.*}} -> tensor<?x?x6144xf32>
// CHECK-LABEL: func.func @decode(%arg0: tensor<?x?x6144xf32>, %arg1: tensor<?x?x6144xf32>, %arg2: tensor<?xi32>, %arg3: tensor<?xi32>, %arg4: tensor<?x?x9xi32>) -> tensor<?x?x32000xf32> attributes {lm.method = "pair_decode"}
// CHECK: lm.slice_features %arg0 {offset = 0 : i64, size = 512 : i64}
// CHECK-NEXT: lm.slice_features %arg0 {offset = 512 : i64, size = 512 : i64}
// CHECK: lm.mask_fill {{.*}}, %arg3 data(%arg4 : tensor<?x?x9xi32>) {mask = #lm.mask<directional>}
// CHECK: lm.slice_features %arg1 {offset = 0 : i64, size = 512 : i64}
// CHECK: lm.slice_features %arg0 {offset = 5632 : i64, size = 512 : i64}
// CHECK: lm.log_softmax {{.*}} : tensor<?x?x32000xf32>
// CHECK-LABEL: func.func @step(%arg0: tensor<?x?x6144xf32>, %arg1: tensor<?x?x6144xf32>, %arg2: tensor<?xi32>, %arg3: tensor<?xi32>, %arg4: tensor<?x?x9xi32>, %arg5: tensor<?xi32>) -> tensor<?x1x32000xf32> attributes {lm.method = "pair_step"}
// CHECK: lm.take_row {{.*}}, %arg5 : (tensor<?x?x512xf32>, tensor<?xi32>) -> tensor<?x1x512xf32>
// CHECK: lm.attention {{.*}}, %arg3 data(%arg4 : tensor<?x?x9xi32>) relative({{.*}}) query_positions(%arg5 : tensor<?xi32>) {clip = 16 : i64, heads = 8 : i64, mask = #lm.mask<directional>
// CHECK: lm.attention {{.*}}, %arg2 {heads = 8 : i64, mask = #lm.mask<none>
// CHECK: lm.log_softmax {{.*}} : tensor<?x1x32000xf32>
