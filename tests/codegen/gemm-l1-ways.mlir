// RUN: lmcc-opt --lm-to-loops="vector-bits=512 l1-ways=8" %s | FileCheck %s --check-prefix=WAYS8
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 l1-ways=12" %s | FileCheck %s --check-prefix=WAYS12
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 l1-ways=-1" %s | FileCheck %s --check-prefix=WAYS12
// RUN: lmcc-opt --lm-to-loops="vector-bits=256 l1-ways=4" %s | FileCheck %s --check-prefix=AVX2
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 l1-ways=8 weights-dtype=bf16 bf16-dot=yes" %s | FileCheck %s --check-prefix=DOT
// RUN: not lmcc-opt --lm-to-loops="l1-ways=-2" %s 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not lmcc-opt --lm-to-loops="l1-ways=65" %s 2>&1 | FileCheck %s --check-prefix=BAD65
// RUN: not lmcc-opt --lm-to-loops="vector-bits=128" %s 2>&1 | FileCheck %s --check-prefix=BITS
// l1-ways (GemmTile::forDepth): on an L1 with fewer ways than the 12 x 32 tile has rows, a weight whose depth is a
// multiple of 1024 (A's rows 4 KB apart, all in the same L1 sets) gets the 5 x 64 fp32 tile, for its product and
// for its packing at load time (64-wide column slices: a panel's one slice is K x 64 floats); other depths, wider
// L1s, an unknown L1 (-1), AVX2's 6 x 16 tile and bf16 weights keep the target's tile.

// WAYS8-DAG: func.func private @lm_gemm_1024x512_bias_12x32
// WAYS8-DAG: func.func private @lm_gemm_8x1024_5x64
// WAYS8-DAG: func.func private @lm_gemm_task_8x1024_5x64
// The packer's slices are c columns x K words: 32 x 512 = 16384 for the 1024 x 512 weight, 64 x 1024 = 65536 (5 x 64
// tile) or 32 x 1024 = 32768 (12 x 32) for the 8 x 1024 one.
// WAYS8-LABEL: func.func @m_init_kernel
// WAYS8: arith.constant 16384 : index
// WAYS8: arith.constant 65536 : index
// WAYS8: return

// WAYS12-DAG: func.func private @lm_gemm_1024x512_bias_12x32
// WAYS12-DAG: func.func private @lm_gemm_8x1024_12x32
// WAYS12-NOT: 5x64
// WAYS12-LABEL: func.func @m_init_kernel
// WAYS12: arith.constant 16384 : index
// WAYS12-NOT: arith.constant 65536 : index
// WAYS12: arith.constant 32768 : index
// WAYS12-NOT: arith.constant 65536 : index
// WAYS12: return

// AVX2-DAG: func.func private @lm_gemm_1024x512_bias_6x16
// AVX2-DAG: func.func private @lm_gemm_8x1024_6x16

// DOT-DAG: func.func private @lm_gemm_1024x512_bias_12x32_bf16dot
// DOT-DAG: func.func private @lm_gemm_8x1024_12x32_bf16dot

// BAD: l1-ways must be a number of ways (1 to 64), 0 (this host's) or -1 (unknown), got -2
// BAD65: l1-ways must be a number of ways (1 to 64), 0 (this host's) or -1 (unknown), got 65
// BITS: vector-bits must be 512 (AVX-512), 256 (AVX2) or 0 (this host's), got 128
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 512, heads = 2, d_ff = 1024,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x8xf32> {
    %E = lm.weight "embed.token" : tensor<11x512xf32>
    %x = lm.embed %E[%ids] : (tensor<11x512xf32>, tensor<?x?xi32>) -> tensor<?x?x512xf32>
    %W = lm.weight "layers.0.ffn.in.weight" : tensor<1024x512xf32>
    %b = lm.weight "layers.0.ffn.in.bias" : tensor<1024xf32>
    %y = lm.linear %x, %W, %b : (tensor<?x?x512xf32>, tensor<1024x512xf32>, tensor<1024xf32>) -> tensor<?x?x1024xf32>
    %V = lm.weight "layers.0.ffn.out.weight" : tensor<8x1024xf32>
    %z = lm.linear %y, %V : (tensor<?x?x1024xf32>, tensor<8x1024xf32>) -> tensor<?x?x8xf32>
    %e = lm.mean_pool %z, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
    return %e : tensor<?x8xf32>
  }
}
