// RUN: lmcc-opt --lm-to-loops %s | FileCheck %s
// lm-to-loops, Attention.cpp / AttentionGrad.cpp: the Diformer's directional mask (rows [B, N, 1 + W]: direction,
// then W words of hidden-key bits; lm.mask_fill states them) in the vector forms of lm.attention and
// lm.attention_grad (head size 16): the rows' address and row count go to the task with the other operands; each
// tile row's key range follows its direction (R [0, i], L [i, len), S [0, len), skip none), a block is tested
// lane by lane unless every row sees all of it (an S row's hidden bits of the block: 16 bits of word 1 + jb / 32,
// and its own key outside it), the hidden lanes by a vector shift of those bits; the backward zeroes the keys a
// tile starts past (the touched keys stay a prefix); no call to the runtime's C++ backward.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 40, d_model = 32, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>, %rows: tensor<?x?x3xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x32xf32>
    %x = lm.embed %E[%ids] : (tensor<11x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
    %o = lm.attention %x, %x, %x, %lengths data(%rows : tensor<?x?x3xi32>) {heads = 2 : i64, mask = #lm.mask<directional>, scale = 0.25 : f32} : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>
    %dq, %dk, %dv = lm.attention_grad %o, %x, %x, %x, %lengths data(%rows : tensor<?x?x3xi32>) {heads = 2 : i64, mask = #lm.mask<directional>, scale = 0.25 : f32}
        : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>
    %s1 = lm.add %dq, %dk : tensor<?x?x32xf32>
    %s2 = lm.add %s1, %dv : tensor<?x?x32xf32>
    %de = lm.embed_grad %s2, %ids, %lengths : (tensor<?x?x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<11x32xf32>
    lm.param_grad %de {name = "embed.token"} : tensor<11x32xf32>
    %ce, %lse = lm.token_loss %x, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x32xf32>, tensor<11x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// forward: the rows' address and their row count among the task's 13 fields
// CHECK: memref.alloca() : memref<13xi64>
// CHECK: func.call @lm_attention_task_directional_h2_d32_s0x3e800000_w3(
// backward: 17 fields
// CHECK: memref.alloca() : memref<17xi64>
// CHECK: func.call @lm_attention_grad_task_directional_h2_d32_s0x3e800000_w3(
// CHECK-NOT: lm_rt_attention_grad

// The forward task: the rows viewed [entries, N, 3]; per tile row its direction (0 R, 1 L, 2 S, 3 skip) ...
// CHECK-LABEL: func.func private @lm_attention_task_directional_h2_d32_s0x3e800000_w3(
// CHECK: memref<?x?x3xi32>
// CHECK: memref.load {{.*}} : memref<?x?x3xi32>
// CHECK: arith.cmpi eq, %{{.*}}, %c3_i32
// ... per score block the S rows' 16 hidden bits (word 1 + jb / 32, shifted by jb mod 32) ...
// CHECK: arith.divui {{.*}}, %c32
// CHECK: arith.remui {{.*}}, %c32
// CHECK: arith.shrui {{.*}} : i32
// CHECK: arith.andi {{.*}}, %c65535_i32
// ... and, in blocks some row does not see whole, the hidden lanes by a vector shift
// CHECK: arith.shrui {{.*}} : vector<16xi32>
// CHECK: arith.select {{.*}} : vector<16xi1>, vector<16xf32>

// The backward task: the same tests, and the keys between the touched prefix and a tile's first key zeroed
// CHECK-LABEL: func.func private @lm_attention_grad_task_directional_h2_d32_s0x3e800000_w3(
// CHECK: %[[ZC:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT: %[[ZERO:.*]] = vector.broadcast %[[ZC]] : f32 to vector<16xf32>
// CHECK: %[[DK:.*]] = memref.alloc({{.*}}) {alignment = 64 : i64} : memref<2x?x16xf32>
// CHECK: %[[DV:.*]] = memref.alloc({{.*}}) {alignment = 64 : i64} : memref<2x?x16xf32>
// CHECK: arith.shrui {{.*}} : vector<16xi32>
// CHECK: vector.store %[[ZERO]], %[[DK]][%{{.*}}, %[[J:.*]], %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// CHECK: vector.store %[[ZERO]], %[[DV]][%{{.*}}, %[[J]], %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
