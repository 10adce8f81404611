// RUN: lmcc-opt --lm-to-loops="vector-bits=256" %s | FileCheck %s
// lm-to-loops, Attention.cpp / AttentionGrad.cpp: Shaw relative positions (clip 2, tables [5, 16]) in the vector
// forms of lm.attention and lm.attention_grad (head size 16): the tables' addresses go to the task with the
// other operands, the relative scratch is one block cut into views (the tables transposed, the per-table-row
// sums, the padded relative scores), each tile's rows multiply the key table's rows a causal row reaches (t <= 2 of 5; not one product per key),
// the interior table rows' probabilities are masked loads of the row, and the backward's per-item table gradients
// are summed in item order after the items ran; no call to the runtime's C++ backward.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 32, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x32xf32>
    %rk = lm.weight "layers.0.attn.rel_k" : tensor<5x16xf32>
    %rv = lm.weight "layers.0.attn.rel_v" : tensor<5x16xf32>
    %x = lm.embed %E[%ids] : (tensor<11x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
    %o = lm.attention %x, %x, %x, %lengths relative(%rk, %rv : tensor<5x16xf32>, tensor<5x16xf32>) {clip = 2 : i64, heads = 2 : i64, mask = #lm.mask<causal>, scale = 0.25 : f32} : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>
    %dq, %dk, %dv, %drk, %drv = lm.attention_grad %o, %x, %x, %x, %lengths relative(%rk, %rv : tensor<5x16xf32>, tensor<5x16xf32>) {clip = 2 : i64, heads = 2 : i64, mask = #lm.mask<causal>, scale = 0.25 : f32}
        : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<5x16xf32>, tensor<5x16xf32>
    lm.param_grad %drk {name = "layers.0.attn.rel_k"} : tensor<5x16xf32>
    lm.param_grad %drv {name = "layers.0.attn.rel_v"} : tensor<5x16xf32>
    %s1 = lm.add %dq, %dk : tensor<?x?x32xf32>
    %s2 = lm.add %s1, %dv : tensor<?x?x32xf32>
    %de = lm.embed_grad %s2, %ids, %lengths : (tensor<?x?x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<11x32xf32>
    lm.param_grad %de {name = "embed.token"} : tensor<11x32xf32>
    %ce, %lse = lm.token_loss %x, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x32xf32>, tensor<11x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// forward: q, k, v, out, lengths, positions (0), rel_k, rel_v, directional rows and their count (0, 0), then B,
// rows, keys
// CHECK: memref.alloca() : memref<13xi64>
// CHECK: func.call @lm_attention_task_causal_h2_d32_s0x3e800000_rel2(
// backward: the items' table gradients [2 B H, 5, 16], the task (dO, q, k, v, dq, dk, dv, lengths, query lengths,
// rel_k, rel_v, the items' table gradients, directional rows and their count, B, rows, keys), then their sums in item order: per table row and
// 16 features, a loop over the items adding vectors
// CHECK: memref.alloc(%{{.*}}) {alignment = 64 : i64} : memref<?x5x16xf32>
// CHECK: memref.alloca() : memref<17xi64>
// CHECK: func.call @lm_attention_grad_task_causal_h2_d32_s0x3e800000_rel2(
// The sums are stored straight into rel_k's gradient slot (float 352 = byte 1408 of the gradient buffer), not
// into a temporary copied there afterwards.
// CHECK: arith.addi %{{.*}}, %c1408_i64 : i64
// CHECK: %[[DRK:.*]] = builtin.unrealized_conversion_cast {{.*}} to memref<5x16xf32>
// CHECK: scf.for
// CHECK: scf.for
// CHECK: scf.for {{.*}} iter_args
// CHECK: arith.addf {{.*}} : vector<16xf32>
// CHECK: vector.store %{{.*}}, %[[DRK]][
// CHECK-NOT: memref.copy
// CHECK-NOT: lm_rt_attention_grad
// CHECK-NOT: lm.attention

// The forward's task: one scratch block in views, the key table transposed, each tile's products with its 5 rows,
// the relative scores added per key block, the interior table rows' probabilities by masked loads.
// CHECK-LABEL: func.func private @lm_attention_task_causal_h2_d32_s0x3e800000_rel2(
// CHECK: memref.alloc(%{{.*}}) {alignment = 64 : i64} : memref<?xi8>
// CHECK: memref.view {{.*}} to memref<16x32xf32>
// CHECK: memref.view {{.*}} to memref<8x32xf32>
// CHECK: memref.view {{.*}} to memref<8x?xf32>
// CHECK: vector.fma
// CHECK: vector.maskedload
// CHECK-LABEL: func.func private @lm_attention_grad_task_causal_h2_d32_s0x3e800000_rel2(
// CHECK: memref.view {{.*}} to memref<16x32xf32>
// CHECK: memref.view {{.*}} to memref<16x32xf32>
// CHECK: vector.maskedload
