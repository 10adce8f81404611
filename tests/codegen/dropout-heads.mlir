// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// lm-to-loops, Backward.cpp: a training lm.dropout and lm.dropout_grad on [B, H, N, M] attention probabilities
// ([train] attention_dropout) call lm_rt_dropout_heads with the tensor's four sizes, the rate and the site (a
// [B, N, C] one calls lm_rt_dropout, tests/codegen/backward.mlir); outside training lm.dropout is its input.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %xh = lm.split_heads %x : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
    %s = lm.matmul %xh, %xh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
    %p = lm.softmax %s : tensor<?x2x?x?xf32>
    %pd = lm.dropout %p {rate = 2.500000e-01 : f64, site = 1048576 : i64, training} : tensor<?x2x?x?xf32>
    %pe = lm.dropout %p {rate = 2.500000e-01 : f64, site = 1048577 : i64} : tensor<?x2x?x?xf32>
    %pg = lm.dropout_grad %pe {rate = 2.500000e-01 : f64, site = 1048577 : i64} : tensor<?x2x?x?xf32>
    %sum = lm.add %pd, %pg : tensor<?x2x?x?xf32>
    %c = lm.matmul %sum, %xh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
    %h = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
    %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// CHECK-SAME: %{{[^:]+}}: memref<?xf32>, %{{[^:]+}}: memref<?x?xi32>, %{{[^:]+}}: memref<?x?xi32>, %[[LEN:[^:]+]]: memref<?xi32>,
// The training dropout: the probabilities, the entry's lengths, the four sizes of the probabilities, rate, site.
// CHECK: %[[PP:.+]] = memref.extract_aligned_pointer_as_index %[[P:[^ ]+]] : memref<?x2x?x?xf32>
// CHECK: memref.extract_aligned_pointer_as_index %[[LEN]]
// CHECK: %[[D0:.+]] = memref.dim %[[P]], %c0{{.*}} : memref<?x2x?x?xf32>
// CHECK-NEXT: %[[B:.+]] = arith.index_cast %[[D0]] : index to i64
// CHECK: %[[D1:.+]] = memref.dim %[[P]], %c1{{.*}} : memref<?x2x?x?xf32>
// CHECK-NEXT: %[[H:.+]] = arith.index_cast %[[D1]] : index to i64
// CHECK: %[[D2:.+]] = memref.dim %[[P]], %c2{{.*}} : memref<?x2x?x?xf32>
// CHECK-NEXT: %[[N:.+]] = arith.index_cast %[[D2]] : index to i64
// CHECK: %[[D3:.+]] = memref.dim %[[P]], %c3{{.*}} : memref<?x2x?x?xf32>
// CHECK-NEXT: %[[M:.+]] = arith.index_cast %[[D3]] : index to i64
// CHECK-NEXT: %[[RATE:.+]] = arith.constant 2.500000e-01 : f64
// CHECK-NEXT: %[[SITE:.+]] = arith.constant 1048576 : i64
// CHECK: call @lm_rt_dropout_heads(%{{[^,]+}}, %{{[^,]+}}, %[[B]], %[[H]], %[[N]], %[[M]], %[[RATE]], %[[SITE]], %{{[^,]+}}) : (!llvm.ptr, !llvm.ptr, i64, i64, i64, i64, f64, i64, !llvm.ptr) -> ()
// The evaluating dropout (no `training`) is no call; its gradient is.
// CHECK-NOT: call @lm_rt_dropout
// CHECK: %[[SITE2:.+]] = arith.constant 1048577 : i64
// CHECK: call @lm_rt_dropout_heads({{.*}}, %[[SITE2]], %{{[^,]+}}) :
// CHECK-NOT: call @lm_rt_dropout
// CHECK: return
