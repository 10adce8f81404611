// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// lm-to-loops, Backward.cpp: the training loss and backward ops become calls of the runtime's training
// kernels on their buffers; lm.param_grad copies into the gradient buffer (the last argument of the
// `<model>_loss_grad_kernel`); the per-row losses are copied into the output argument.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %W = lm.weight "w" : tensor<8x8xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %d = lm.dropout %x {rate = 1.000000e-01 : f64, site = 0 : i64, training} : tensor<?x?x8xf32>
    %h = lm.linear %d, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    %dh, %dE, %db = lm.token_loss_grad %h, %E, %targets, %lengths, %lse {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
    %dx, %dW, %dbW = lm.linear_grad %dh, %d, %W : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<8x8xf32>) -> (tensor<?x?x8xf32>, tensor<8x8xf32>, tensor<8xf32>)
    %dd = lm.dropout_grad %dx {rate = 1.000000e-01 : f64, site = 0 : i64} : tensor<?x?x8xf32>
    %de = lm.embed_grad %dd, %ids, %lengths : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<11x8xf32>
    %sum = lm.add %dE, %de : tensor<11x8xf32>
    lm.param_grad %sum {name = "embed.token"} : tensor<11x8xf32>
    lm.param_grad %dW {name = "w"} : tensor<8x8xf32>
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// CHECK-SAME: %[[W:[^:]+]]: memref<?xf32>, %{{[^:]+}}: memref<?x?xi32>, %{{[^:]+}}: memref<?x?xi32>, %[[LEN:[^:]+]]: memref<?xi32>, %[[CE:[^:]+]]: memref<?x?xf32>, %[[G:[^:]+]]: memref<?xf32>)
// CHECK: call @lm_rt_dropout(
// The kernels with GEMMs get the library's generated training GEMM (a function pointer) and its slice width.
// CHECK: %[[F:.+]] = constant @[[GEMM:lm_train_gemm_[0-9]+x[0-9]+]] : (!llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64) -> ()
// CHECK: %[[P:.+]] = builtin.unrealized_conversion_cast %[[F]] : {{.*}} to !llvm.ptr
// CHECK: call @lm_rt_token_loss({{.*}}, %[[P]], %{{.+}}) :
// CHECK: constant @[[GEMM]]
// CHECK: call @lm_rt_token_loss_grad(
// CHECK: constant @[[GEMM]]
// CHECK: call @lm_rt_linear_grad(
// CHECK: call @lm_rt_dropout(
// CHECK: call @lm_rt_embed_grad(
// The gradients land in the gradient buffer at the weights' offsets.
// CHECK: memref.reinterpret_cast %[[G]] to offset: [{{[0-9]+}}], sizes: [11, 8]
// CHECK: memref.reinterpret_cast %[[G]] to offset: [{{[0-9]+}}], sizes: [8, 8]
// CHECK: memref.store %{{.*}}, %[[CE]]
// CHECK: return
// The training GEMM: dynamic depth, register-tiled FMAs, accumulation selected at run time.
// CHECK: func.func private @[[GEMM]](%{{[^:]+}}: !llvm.ptr, %{{[^:]+}}: i64, %{{[^:]+}}: i64, %{{[^:]+}}: i64, %{{[^:]+}}: !llvm.ptr
// CHECK: vector.fma
// CHECK: arith.select
// CHECK: vector.maskedstore
