// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// RUN: lmcc-opt %s --lm-fuse-loss-grad --lm-to-loops | FileCheck %s --check-prefix=FUSED
// lm-to-loops, Backward.cpp: the training loss and backward ops become calls of the runtime's training
// kernels on their buffers; lm.param_grad writes the gradient buffer (the last argument of the
// `<model>_loss_grad_kernel`): each gradient's buffer is its slot there, and the slots of tensors the loss does not
// reach are zeroed; the per-row losses are copied into the output argument.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %W = lm.weight "w" : tensor<8x8xf32>
    %U = lm.weight "unreached" : tensor<5xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %d = lm.dropout %x {rate = 1.000000e-01 : f64, site = 0 : i64, training} : tensor<?x?x8xf32>
    %h = lm.linear %d, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    %dh, %dE, %db = lm.token_loss_grad %h, %E, %targets, %lengths, %lse {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
    %dx, %dW, %dbW = lm.linear_grad %dh, %d, %W : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<8x8xf32>) -> (tensor<?x?x8xf32>, tensor<8x8xf32>, tensor<8xf32>)
    %dd = lm.dropout_grad %dx {rate = 1.000000e-01 : f64, site = 0 : i64} : tensor<?x?x8xf32>
    %sum = lm.embed_grad %dd, %ids, %lengths into(%dE) : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<11x8xf32>) -> tensor<11x8xf32>
    lm.param_grad %sum {name = "embed.token"} : tensor<11x8xf32>
    lm.param_grad %dW {name = "w"} : tensor<8x8xf32>
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// CHECK-SAME: %[[W:[^:]+]]: memref<?xf32>, %{{[^:]+}}: memref<?x?xi32>, %{{[^:]+}}: memref<?x?xi32>, %[[LEN:[^:]+]]: memref<?xi32>, %[[CE:[^:]+]]: memref<?x?xf32>, %[[G:[^:]+]]: memref<?xf32>)
// Every tensor's slot is written: that of "unreached" (no lm.param_grad; floats [160, 165)) is zeroed first.
// CHECK: memref.extract_aligned_pointer_as_index %[[G]]
// CHECK: arith.addi %{{.+}}, %c640_i64 : i64
// CHECK: %[[BYTES:.+]] = llvm.mlir.constant(20 : i64) : i64
// CHECK: "llvm.intr.memset"(%{{.+}}, %{{.+}}, %[[BYTES]])
// CHECK: call @lm_rt_dropout(
// The kernels with GEMMs get the library's generated training GEMM (a function pointer) and its slice width; depths
// this shallow keep the run-time depth body (train-gemm-depths.mlir: the specialized ones).
// CHECK: %[[F:.+]] = constant @[[GEMM:lm_train_gemm_any_[0-9]+x[0-9]+]] : (!llvm.ptr, i64, i64, i64, !llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64) -> ()
// CHECK: %[[P:.+]] = builtin.unrealized_conversion_cast %[[F]] : {{.*}} to !llvm.ptr
// CHECK: call @lm_rt_token_loss({{.*}}, %[[P]], %{{.+}}) :
// The weight gradients are written straight into their slots of the gradient buffer (no temporary, no copy):
// the token table's dE at float 0 by the loss backward...
// CHECK: memref.extract_aligned_pointer_as_index %[[G]]
// CHECK: arith.addi %{{.+}}, %c0_i64{{(_[0-9]+)?}} : i64
// CHECK: %[[DE:.+]] = builtin.unrealized_conversion_cast %{{.+}} : !llvm.struct<{{.+}}> to memref<11x8xf32>
// CHECK: constant @[[GEMM]]
// CHECK: call @lm_rt_token_loss_grad(
// CHECK: %[[DEC:.+]] = memref.cast %[[DE]] : memref<11x8xf32> to memref<11x8xf32, strided<[8, 1], offset: ?>>
// ... w's dW at float 96 by the linear backward...
// CHECK: memref.extract_aligned_pointer_as_index %[[G]]
// CHECK: arith.addi %{{.+}}, %c384_i64 : i64
// CHECK: builtin.unrealized_conversion_cast %{{.+}} : !llvm.struct<{{.+}}> to memref<8x8xf32>
// CHECK: constant @[[GEMM]]
// CHECK: call @lm_rt_linear_grad(
// CHECK: call @lm_rt_dropout(
// ... and the embedding's scatter adds into dE where it lies (lm.embed_grad into).
// CHECK: memref.extract_aligned_pointer_as_index %[[DEC]]
// CHECK: call @lm_rt_embed_grad_add(
// CHECK-NOT: memref.copy
// CHECK: memref.store %{{.*}}, %[[CE]]
// CHECK: return
// The training GEMM: dynamic depth, register-tiled FMAs, accumulation selected at run time.
// CHECK: func.func private @[[GEMM]](%{{[^:]+}}: !llvm.ptr, %{{[^:]+}}: i64, %{{[^:]+}}: i64, %{{[^:]+}}: i64, %{{[^:]+}}: !llvm.ptr
// CHECK: vector.fma
// CHECK: arith.select
// CHECK: vector.maskedstore

// lm-fuse-loss-grad first: the pair is one runtime call with the keep limit (512 MiB), the token table's gradient
// still written where its slot lies (no copy) and added into by the embedding's scatter.
// FUSED-LABEL: func.func @m_loss_grad_kernel(
// FUSED-SAME: %{{[^:]+}}: memref<?xf32>, %{{[^:]+}}: memref<?x?xi32>, %{{[^:]+}}: memref<?x?xi32>, %{{[^:]+}}: memref<?xi32>, %{{[^:]+}}: memref<?x?xf32>, %[[G:[^:]+]]: memref<?xf32>)
// FUSED-NOT: call @lm_rt_token_loss(
// FUSED: memref.extract_aligned_pointer_as_index %[[G]]
// FUSED: arith.addi %{{.+}}, %c0_i64{{(_[0-9]+)?}} : i64
// FUSED: %[[DE:.+]] = builtin.unrealized_conversion_cast %{{.+}} : !llvm.struct<{{.+}}> to memref<11x8xf32>
// FUSED: call @lm_rt_token_loss_and_grad({{.*}}, %c536870912_i64{{(_[0-9]+)?}}, {{.*}}) :
// FUSED-NOT: call @lm_rt_token_loss_grad(
// FUSED: call @lm_rt_linear_grad(
// FUSED: call @lm_rt_embed_grad_add(
// FUSED-NOT: memref.copy
// FUSED: return
