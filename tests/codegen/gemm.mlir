// RUN: lmcc-opt --lm-to-loops="vector-bits=256" %s | FileCheck %s --check-prefix=GEN
// RUN: lmcc-opt --lm-to-loops="vector-bits=512" %s | FileCheck %s --check-prefix=AVX512
// RUN: lmcc-opt --lm-to-loops="gemm=eigen" %s | FileCheck %s --check-prefix=EIGEN
// RUN: not lmcc-opt --lm-to-loops="gemm=blas" %s 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 weights-dtype=bf16 bf16-dot=yes" %s | FileCheck %s --check-prefix=DOT
// RUN: lmcc-opt --lm-to-loops="vector-bits=256 weights-dtype=bf16 bf16-dot=no" %s | FileCheck %s --check-prefix=WIDEN
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 weights-dtype=bf16 bf16-dot=no" %s | FileCheck %s --check-prefix=WIDEN512
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 weights-dtype=bf16 bf16-dot=amx" %s | FileCheck %s --check-prefix=AMX
// RUN: not lmcc-opt --lm-to-loops="weights-dtype=bf16 bf16-dot=sometimes" %s 2>&1 | FileCheck %s --check-prefix=BADDOT
// RUN: not lmcc-opt --lm-to-loops="gemm=eigen weights-dtype=bf16" %s 2>&1 | FileCheck %s --check-prefix=BF16EIGEN
// lm.linear: the generated GEMM over the load-time packed weight, split over threads by 64-wide panels
// (lm_rt_parallel_for of a task), with the register tile of the target; or the runtime's Eigen GEMM.

// GEN-LABEL: func.func @m_embed_kernel
// GEN: %[[OUT:.+]] = memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x16xf32>
// GEN: memref.alloca() : memref<8xi64>
// GEN: constant @lm_gemm_task_16x8_bias_6x16
// GEN: call @lm_rt_parallel_for
// GEN: func.func private @lm_gemm_16x8_bias_6x16
// GEN: vector.fma
// GEN: func.func private @lm_gemm_task_16x8_bias_6x16
// GEN-LABEL: func.func @m_init_kernel
// The pack: one function per (N, K, tile), called with the weight's offset and its panels' offset.
// GEN: %[[W:.+]] = arith.constant 96 : index
// GEN: %[[P:.+]] = arith.constant 240 : index
// GEN: call @lm_pack_16x8_6x16(%arg0, %[[W]], %[[P]]) : (memref<?xf32>, index, index) -> ()
// The packed weight: ceil(16 / 64) panels of K = 8 rows of 64.
// GEN-LABEL: func.func private @lm_pack_16x8_6x16(%arg0: memref<?xf32>, %arg1: index, %arg2: index) attributes {no_inline}
// GEN: memref.reinterpret_cast %arg0 to offset: [%arg2], sizes: [8, 64], strides: [64, 1]
// GEN: memref.reinterpret_cast %arg0 to offset: [%arg1], sizes: [16, 8], strides: [8, 1]

// AVX512: func.func private @lm_gemm_16x8_bias_12x32

// EIGEN-LABEL: func.func @m_embed_kernel
// EIGEN: call @lm_rt_sgemm_nt
// EIGEN-NOT: lm_rt_parallel_for
// EIGEN-NOT: lm_gemm_

// BAD: lm-to-loops: gemm must be generated or eigen, got blas

// weights-dtype=bf16: W packed as bf16 pairs in 32-bit words (ceil(8 / 2) = 4 rows of 64 per panel). With
// bf16-dot the block of A is rounded to pairs once and every pair is one vdpbf16ps; without, the pairs are
// widened to f32 (word << 16, word & 0xffff0000) for two FMAs.
// DOT: func.func private @lm_gemm_16x8_bias_12x32_bf16dot
// DOT: memref.alloca() : memref<{{[0-9]+}}x4xf32>
// DOT: llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"({{.*}}) : (vector<16xf32>, vector<32xbf16>, vector<32xbf16>) -> vector<16xf32>
// DOT-LABEL: func.func @m_init_kernel
// DOT: call @lm_pack_16x8_12x32_bf16dot(
// DOT: func.func private @lm_pack_16x8_12x32_bf16dot(
// DOT: memref.reinterpret_cast %arg0 to offset: [%arg2], sizes: [4, 64], strides: [64, 1]
// WIDEN: func.func private @lm_gemm_16x8_bias_6x16_bf16
// WIDEN: arith.shli {{.*}} : vector<8xi32>
// WIDEN: arith.andi {{.*}} : vector<8xi32>
// WIDEN-COUNT-2: vector.fma
// WIDEN-NOT: dpbf16ps
// With AVX-512 the widening kernel's tile has 10 rows (20 accumulators, the widened pairs and two broadcasts of A
// fit the 32 zmm without spilling).
// WIDEN512: func.func private @lm_gemm_16x8_bias_10x32_bf16
// WIDEN512: arith.shli {{.*}} : vector<16xi32>
// WIDEN512: arith.andi {{.*}} : vector<16xi32>
// WIDEN512-NOT: dpbf16ps
// BF16EIGEN: lm-to-loops: bf16 weights need the generated GEMM
// bf16-dot=amx: the same packing (32-column slices of pairs). The caller rounds the input's rows to bf16 pairs once
// (vcvtneps2bf16, a masked load past the depth of 8, one 16-pair step per row, rows padded to 32) before the threads
// split the panels, and frees them after; the kernel's C tiles start from the bias, B's last 4 pair-rows come from a
// zeroed 16 x 32 copy, 2 x 2 C tiles of 16 x 16 go straight into C when whole.
// AMX-LABEL: func.func @m_embed_kernel
// AMX: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x16xf32>
// AMX: vector.maskedload
// AMX: arith.truncf {{.*}} : vector<32xf32> to vector<32xbf16>
// AMX: call @lm_rt_parallel_for
// AMX-NEXT: memref.dealloc {{.*}} : memref<?x16xf32>
// AMX: func.func private @lm_gemm_16x8_bias_32x32_bf16amx(%arg0: memref<?x16xf32>
// AMX-NOT: memref.alloc(
// AMX: memref.alloca() : memref<32x32xf32>
// AMX: memref.alloca() : memref<16x32xf32>
// AMX: memref.alloca() : memref<16x32xf32>
// AMX: amx.tile_load {{.*}} into vector<16x16xf32>
// AMX-COUNT-4: amx.tile_mulf {{.*}} : vector<16x32xbf16>, vector<16x32xbf16>, vector<16x16xf32>
// AMX: scf.if
// AMX-COUNT-4: amx.tile_store %arg3
// AMX-LABEL: func.func private @lm_gemm_task_16x8_bias_32x32_bf16amx
// AMX-LABEL: func.func @m_init_kernel
// AMX: call @lm_pack_16x8_32x32_bf16amx(
// AMX: func.func private @lm_pack_16x8_32x32_bf16amx(
// AMX: memref.reinterpret_cast %arg0 to offset: [%arg2], sizes: [4, 64], strides: [64, 1]
// BADDOT: lm-to-loops: weights-dtype must be f32 or bf16 and bf16-dot amx, yes, no or host
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 8, heads = 2, d_ff = 16,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x16xf32> {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %W = lm.weight "layers.0.ffn.in.weight" : tensor<16x8xf32>
    %b = lm.weight "layers.0.ffn.in.bias" : tensor<16xf32>
    %y = lm.linear %x, %W, %b : (tensor<?x?x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<?x?x16xf32>
    %e = lm.mean_pool %y, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x16xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x16xf32>
    return %e : tensor<?x16xf32>
  }
}
