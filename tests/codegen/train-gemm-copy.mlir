// RUN: lmcc-opt %s --lm-to-loops="vector-bits=512 l1-ways=8" | FileCheck %s --check-prefix=WAYS8
// RUN: lmcc-opt %s --lm-to-loops="vector-bits=512 l1-ways=12" | FileCheck %s --check-prefix=WAYS12
// RUN: lmcc-opt %s --lm-to-loops="vector-bits=512 l1-ways=-1" | FileCheck %s --check-prefix=WAYS12
// RUN: lmcc-opt %s --lm-to-loops="vector-bits=256 l1-ways=8" | FileCheck %s --check-prefix=AVX2
// lm-to-loops (Gemm.h getOrCreateTrainGemm, l1-ways): a training GEMM body of static depth whose rows of A overflow
// the L1 sets they share (a depth multiple of 1024, more tile rows than L1 ways) reads a copy of each row block of
// A with rows 528 floats apart, as the run-time depth body always does; its name ends in c. Here the middle
// linear's backward dx = du U has depth 1024: copied by the 12-row tile on an 8-way L1, not on a 12-way or unknown L1,
// nor by AVX2's 6-row tile on an 8-way one.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 600, max_len = 9, d_model = 64, heads = 2, d_ff = 1024,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<600x64xf32>
    %W = lm.weight "w" : tensor<1024x64xf32>
    %U = lm.weight "u" : tensor<1024x1024xf32>
    %V = lm.weight "v" : tensor<64x1024xf32>
    %x = lm.embed %E[%ids] : (tensor<600x64xf32>, tensor<?x?xi32>) -> tensor<?x?x64xf32>
    %a = lm.linear %x, %W : (tensor<?x?x64xf32>, tensor<1024x64xf32>) -> tensor<?x?x1024xf32>
    %u = lm.linear %a, %U : (tensor<?x?x1024xf32>, tensor<1024x1024xf32>) -> tensor<?x?x1024xf32>
    %h = lm.linear %u, %V : (tensor<?x?x1024xf32>, tensor<64x1024xf32>) -> tensor<?x?x64xf32>
    %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x64xf32>, tensor<600x64xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    %dh, %dE, %db = lm.token_loss_grad %h, %E, %targets, %lengths, %lse {smoothing = 0.0 : f64} : (tensor<?x?x64xf32>, tensor<600x64xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x64xf32>, tensor<600x64xf32>, tensor<600xf32>)
    %du, %dV, %dbV = lm.linear_grad %dh, %u, %V : (tensor<?x?x64xf32>, tensor<?x?x1024xf32>, tensor<64x1024xf32>) -> (tensor<?x?x1024xf32>, tensor<64x1024xf32>, tensor<64xf32>)
    %da, %dU, %dbU = lm.linear_grad %du, %a, %U : (tensor<?x?x1024xf32>, tensor<?x?x1024xf32>, tensor<1024x1024xf32>) -> (tensor<?x?x1024xf32>, tensor<1024x1024xf32>, tensor<1024xf32>)
    %dx, %dW, %dbW = lm.linear_grad %da, %x, %W : (tensor<?x?x1024xf32>, tensor<?x?x64xf32>, tensor<1024x64xf32>) -> (tensor<?x?x64xf32>, tensor<1024x64xf32>, tensor<1024xf32>)
    lm.param_grad %dE {name = "embed.token"} : tensor<600x64xf32>
    lm.param_grad %dV {name = "v"} : tensor<64x1024xf32>
    lm.param_grad %dU {name = "u"} : tensor<1024x1024xf32>
    lm.param_grad %dW {name = "w"} : tensor<1024x64xf32>
    return %ce : tensor<?x?xf32>
  }
}

// The run-time depth body copies A whatever the target.
// WAYS8: func.func private @lm_train_gemm_any_12x32(
// WAYS8: memref.alloc({{.+}}) {alignment = 64 : i64} : memref<?x528xf32>
// WAYS8: func.func private @lm_train_gemm_12x32_for_k1024pc(
// WAYS8: func.call @[[BODY:lm_train_gemm_12x32_k1024pc]](
// The static body: A [M, 1024] read once per row block into its copy, every tile's loads from the copy.
// WAYS8: func.func private @[[BODY]](
// WAYS8: memref<?x1024xf32>
// WAYS8: %[[COPY:.+]] = memref.alloc({{.+}}) {alignment = 64 : i64} : memref<?x528xf32>
// WAYS8: vector.store %{{.+}}, %[[COPY]]
// WAYS8: memref.load %[[COPY]]
// WAYS8: vector.fma
// WAYS8: memref.dealloc %[[COPY]]

// WAYS12: func.func private @lm_train_gemm_12x32_for_k1024p(
// WAYS12-NOT: k1024pc
// WAYS12: func.func private @lm_train_gemm_12x32_k1024p(
// WAYS12-NOT: memref<?x528xf32>
// WAYS12: vector.fma
// WAYS12: return

// AVX2-NOT: k1024pc
// AVX2: func.func private @lm_train_gemm_6x16_k1024p(
