// RUN: lmcc-opt --lm-to-loops="vector-bits=256" %s | FileCheck %s
// Embeddings, LayerNorm, GELU and residual add become loop nests over buffers (the last three in row tasks); weights are views at their
// layout offsets in the flat weight buffer (argument 0); mean_pool writes the embed kernel's output.

// CHECK-LABEL: func.func @m_embed_kernel
// CHECK-SAME: (%[[W:.+]]: memref<?xf32>, %[[IDS:.+]]: memref<?x?xi32>, %[[LEN:.+]]: memref<?xi32>, %[[OUT:.+]]: memref<?x8xf32>)
// CHECK-SAME: llvm.emit_c_interface
// CHECK-DAG: memref.reinterpret_cast %[[W]] to offset: [0], sizes: [11, 8], strides: [8, 1]
// CHECK-DAG: memref.reinterpret_cast %[[W]] to offset: [96], sizes: [8], strides: [1]
// lm.embed: out[b, t, c] = table[ids[b, t], c]
// CHECK: %[[X:.+]] = memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x8xf32>
// CHECK: scf.for
// CHECK: memref.load %[[IDS]]
// CHECK: arith.index_cast
// lm.layer_norm, lm.gelu and lm.add: one row task each (the rows [B * N, 8] from the buffers' addresses in a ctx
// array), called on this thread below 2^17 units of work, else split over the runtime's threads.
// CHECK: func.call @lm_rows_layernorm_3D719799812DEA11_c8(%{{.*}}, %c0_i64, %{{.*}}) : (!llvm.ptr, i64, i64) -> ()
// CHECK: func.call @lm_rt_parallel_for
// CHECK: func.call @lm_rows_gelu_erf_c8
// CHECK: func.call @lm_rt_parallel_for
// The layer norm's result is freed after the call that reads it.
// CHECK-NEXT: }
// CHECK-NEXT: memref.dealloc
// CHECK: func.call @lm_rows_add_c8
// lm.mean_pool into the output argument
// CHECK: memref.store {{.*}}, %[[OUT]]
// Every buffer is freed at the end of the kernel.
// CHECK: memref.dealloc %[[X]]
// CHECK: return
// The row tasks: rows [begin, end) of memref<?x8xf32> views; LayerNorm's mean and variance in double.
// CHECK-LABEL: func.func private @lm_rows_layernorm_3D719799812DEA11_c8(%{{.*}}: !llvm.ptr, %{{.*}}: i64, %{{.*}}: i64)
// CHECK: builtin.unrealized_conversion_cast {{.*}} to memref<?x8xf32>
// CHECK: arith.extf {{.*}} : f32 to f64
// CHECK: math.sqrt {{.*}} : f64
// GELU without a division: e = exp(|x| R(|x|)) (R in Horner form), s = 2 - e or e by the sign of x.
// CHECK-LABEL: func.func private @lm_rows_gelu_erf_c8
// CHECK: scf.for
// CHECK: math.absf
// CHECK: arith.minimumf
// CHECK-COUNT-10: math.fma
// CHECK-NOT: arith.divf
// CHECK: arith.select
// CHECK-NOT: arith.divf
// CHECK-LABEL: func.func private @lm_rows_add_c8
// CHECK: arith.addf {{.*}} : f32
// CHECK-LABEL: func.func @m_init_kernel
// CHECK-NOT: lm.
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 8, heads = 2, d_ff = 16,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x8xf32> {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %g = lm.weight "embed.norm.weight" : tensor<8xf32>
    %b = lm.weight "embed.norm.bias" : tensor<8xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %n = lm.layer_norm %x, %g, %b {epsilon = 1.0e-12 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
    %a = lm.gelu %n : tensor<?x?x8xf32>
    %r = lm.add %a, %x : tensor<?x?x8xf32>
    %e = lm.mean_pool %r, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
    return %e : tensor<?x8xf32>
  }
}
