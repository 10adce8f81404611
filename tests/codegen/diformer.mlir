// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// lm-to-loops, Diformer.cpp and the directional mask (issue 19): the decoder queries pick a direction row and
// an l2r or (L rows) r2l position row; the targets a neighbour by direction (-1 for skip rows); the length
// head a mean over the source, a matvec and a log-softmax; the attention (scalar form: relative positions)
// narrows each row's key range by its direction and tests S rows' hidden-key bits (word 1 + j / 32,
// bit j % 32) per key; a cross-attention's keys come from another sequence than its queries.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @score(%src: tensor<?x?xi32>, %slen: tensor<?xi32>, %tgt: tensor<?x?xi32>, %tlen: tensor<?xi32>, %rows: tensor<?x?x2xi32>)
      -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>, tensor<?xf32>) attributes {lm.method = "pairs"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %D = lm.weight "decoder.direction" : tensor<3x8xf32>
    %P = lm.weight "decoder.position.l2r" : tensor<9x8xf32>
    %Q = lm.weight "decoder.position.r2l" : tensor<9x8xf32>
    %W = lm.weight "length.weight" : tensor<9x8xf32>
    %RK = lm.weight "decoder.layers.0.attn.rel_k" : tensor<5x4xf32>
    %RV = lm.weight "decoder.layers.0.attn.rel_v" : tensor<5x4xf32>
    %m = lm.embed %E[%src] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %l = lm.length_logprob %m, %slen, %W, %tlen : (tensor<?x?x8xf32>, tensor<?xi32>, tensor<9x8xf32>, tensor<?xi32>) -> tensor<?xf32>
    %y = lm.embed %E[%tgt] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %q = lm.decoder_queries %rows, %tlen, %D, %P, %Q : (tensor<?x?x2xi32>, tensor<?xi32>, tensor<3x8xf32>, tensor<9x8xf32>, tensor<9x8xf32>) -> tensor<?x?x8xf32>
    %a = lm.attention %q, %y, %y, %tlen data(%rows : tensor<?x?x2xi32>) relative(%RK, %RV : tensor<5x4xf32>, tensor<5x4xf32>) {clip = 2 : i64, heads = 2 : i64, mask = #lm.mask<directional>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %c = lm.attention %a, %m, %m, %slen {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %t = lm.directional_targets %tgt, %rows, %tlen : (tensor<?x?xi32>, tensor<?x?x2xi32>, tensor<?xi32>) -> tensor<?x?xi32>
    %g = lm.token_logprob %c, %E, %t, %tlen : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    %tl, %s, %n = lm.sentence_score %g, %t, %tlen {first = 0 : i64, skip = array<i32: -1>} : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>)
    return %tl, %s, %n, %l : tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>, tensor<?xf32>
  }
  func.func @encode(%src: tensor<?x?xi32>, %slen: tensor<?xi32>) -> (tensor<?x9xf32>, tensor<?x?x8xf32>)
      attributes {lm.method = "pair_encode"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %W = lm.weight "length.weight" : tensor<9x8xf32>
    %m = lm.embed %E[%src] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %l = lm.length_logprob %m, %slen, %W : (tensor<?x?x8xf32>, tensor<?xi32>, tensor<9x8xf32>) -> tensor<?x9xf32>
    return %l, %m : tensor<?x9xf32>, tensor<?x?x8xf32>
  }
  func.func @step(%kv: tensor<?x?x16xf32>, %slen: tensor<?xi32>, %tlen: tensor<?xi32>, %rows: tensor<?x?x2xi32>, %pos: tensor<?xi32>)
      -> tensor<?x1x8xf32> attributes {lm.method = "pair_step"} {
    %D = lm.weight "decoder.direction" : tensor<3x8xf32>
    %P = lm.weight "decoder.position.l2r" : tensor<9x8xf32>
    %Q = lm.weight "decoder.position.r2l" : tensor<9x8xf32>
    %RK = lm.weight "decoder.layers.0.attn.rel_k" : tensor<5x4xf32>
    %RV = lm.weight "decoder.layers.0.attn.rel_v" : tensor<5x4xf32>
    %k = lm.slice_features %kv {offset = 0 : i64, size = 8 : i64} : (tensor<?x?x16xf32>) -> tensor<?x?x8xf32>
    %v = lm.slice_features %kv {offset = 8 : i64, size = 8 : i64} : (tensor<?x?x16xf32>) -> tensor<?x?x8xf32>
    %q = lm.decoder_queries %rows, %tlen, %D, %P, %Q : (tensor<?x?x2xi32>, tensor<?xi32>, tensor<3x8xf32>, tensor<9x8xf32>, tensor<9x8xf32>) -> tensor<?x?x8xf32>
    %r = lm.take_row %q, %pos : (tensor<?x?x8xf32>, tensor<?xi32>) -> tensor<?x1x8xf32>
    %a = lm.attention %r, %k, %v, %tlen data(%rows : tensor<?x?x2xi32>) relative(%RK, %RV : tensor<5x4xf32>, tensor<5x4xf32>) query_positions(%pos : tensor<?xi32>) {clip = 2 : i64, heads = 2 : i64, mask = #lm.mask<directional>, scale = 5.000000e-01 : f32} : tensor<?x1x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x1x8xf32>
    return %a : tensor<?x1x8xf32>
  }
}

// The kernel takes the rows as a rank-3 buffer and writes four outputs.
// CHECK-LABEL: func.func @m_score_kernel(
// CHECK-SAME: memref<?x?x2xi32>
// CHECK-SAME: memref<?xf32>, %{{.+}}: memref<?xi32>, %{{.+}}: memref<?xf32>)
// Length head: a mean over the source, a log-softmax in double, -inf outside [0, max_len).
// CHECK: arith.sitofp
// CHECK: math.log {{.*}} : f64
// CHECK: arith.constant 0xFF800000 : f32
// Decoder queries: the direction row, then r2l (L rows) or l2r.
// CHECK: arith.constant 1 : i32
// CHECK: arith.constant 2 : i32
// The directional attention: the row's direction code, hidden-key bits shifted out of word 1 + j / 32.
// CHECK: arith.constant 3 : i32
// CHECK: arith.divui {{.*}}, %c32
// CHECK: arith.remui {{.*}}, %c32
// CHECK: arith.shrui
// Targets: -1 where a row has none; token log-probs 0 for negative targets.
// CHECK: arith.constant -1 : i32
// CHECK: arith.cmpi sge
// The length log-probs copied into the fourth output.
// CHECK: memref.store {{.*}} : memref<?xf32>
// CHECK: return

// The encoder entry writes the memory and every length's log-probability (no target lengths).
// CHECK-LABEL: func.func @m_encode_kernel(
// CHECK-SAME: memref<?x9xf32>, %{{.+}}: memref<?x?x8xf32>)
// CHECK: math.log {{.*}} : f64
// CHECK: memref.store {{.*}} : memref<?x9xf32>
// A decoding step: the query row taken at its position, its key range and relative offsets from that position.
// CHECK-LABEL: func.func @m_step_kernel(
// CHECK-SAME: memref<?xi32>, %{{.+}}: memref<?x1x8xf32>)
// CHECK: memref.load %arg5
// CHECK: memref.store {{.*}} : memref<?x1x8xf32>
