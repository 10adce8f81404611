// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// lm-to-loops, Backward.cpp: where a gradient cannot simply become its slot. The token table's head gradient dE is
// also the gradient of "other" (two uses), so lm.embed_grad ... into(dE) adds into a copy of it (which itself is
// embed.token's slot), while dE is written in place in "other"'s slot; dW is read after its lm.param_grad (loads
// only: the slot keeps dW), so it is still written in place, and the lm.add reads it there.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %O = lm.weight "other" : tensor<11x8xf32>
    %W = lm.weight "w" : tensor<8x8xf32>
    %W2 = lm.weight "w2" : tensor<8x8xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %h = lm.linear %x, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    %dh, %dE, %db = lm.token_loss_grad %h, %E, %targets, %lengths, %lse {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
    %dx, %dW, %dbW = lm.linear_grad %dh, %x, %W : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<8x8xf32>) -> (tensor<?x?x8xf32>, tensor<8x8xf32>, tensor<8xf32>)
    %sum = lm.embed_grad %dx, %ids, %lengths into(%dE) : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<11x8xf32>) -> tensor<11x8xf32>
    lm.param_grad %sum {name = "embed.token"} : tensor<11x8xf32>
    lm.param_grad %dE {name = "other"} : tensor<11x8xf32>
    lm.param_grad %dW {name = "w"} : tensor<8x8xf32>
    %z = lm.add %dW, %dW : tensor<8x8xf32>
    lm.param_grad %z {name = "w2"} : tensor<8x8xf32>
    return %ce : tensor<?x?xf32>
  }
}

// Slots (floats, 64-byte aligned): embed.token 0, other 96, w 192, w2 256.
// CHECK-LABEL: func.func @m_loss_grad_kernel(
// CHECK-SAME: %[[G:[^:]+]]: memref<?xf32>)
// CHECK: call @lm_rt_token_loss(
// dE in other's slot (byte 384), dW in w's (byte 768):
// CHECK: arith.addi %{{.+}}, %c384_i64 : i64
// CHECK: %[[DE:.+]] = builtin.unrealized_conversion_cast %{{.+}} to memref<11x8xf32>
// CHECK: call @lm_rt_token_loss_grad(
// CHECK: %[[DEC:.+]] = memref.cast %[[DE]]
// CHECK: arith.addi %{{.+}}, %c768_i64 : i64
// CHECK: %[[DW:.+]] = builtin.unrealized_conversion_cast %{{.+}} to memref<8x8xf32>
// CHECK: call @lm_rt_linear_grad(
// CHECK: %[[DWC:.+]] = memref.cast %[[DW]]
// The scatter adds into a copy of dE made in embed.token's slot (byte 0), not into dE.
// CHECK: arith.addi %{{.+}}, %c0_i64{{(_[0-9]+)?}} : i64
// CHECK: %[[SUM:.+]] = builtin.unrealized_conversion_cast %{{.+}} to memref<11x8xf32>
// CHECK: memref.copy %[[DEC]], %[[SUM]]
// CHECK: memref.extract_aligned_pointer_as_index %[[SUM]]
// CHECK: call @lm_rt_embed_grad_add(
// w2's gradient dW + dW, into its slot (byte 1024), reading dW from w's slot.
// CHECK: arith.addi %{{.+}}, %c1024_i64 : i64
// CHECK: %[[Z:.+]] = builtin.unrealized_conversion_cast %{{.+}} to memref<8x8xf32>
// CHECK: memref.load %[[DWC]]
// CHECK: arith.addf
// CHECK: memref.store %{{.+}}, %[[Z]]
// CHECK-NOT: memref.copy
// CHECK: return
