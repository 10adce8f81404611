// RUN: lmcc emit-mlir %inputs/specs/tiny_tta.toml | lmcc-opt --lm-fuse-attention --lm-hoist-isolated-kv --lm-fold-constants --lm-to-loops="vector-bits=256" | FileCheck %s
// Weights are views at their layout offsets; the stack lm-hoist-isolated-kv builds (2 layers x K, V: [120, 30])
// is one view of four tensors laid out back to back; folded tables are read from the weight buffer; the init
// kernel packs every GEMM weight into 64-wide panels and calls each lowered lm.fold function, which writes its
// [max_len = 24, 30] table.

// CHECK-LABEL: func.func @tiny_tta_score_kernel(%arg0: memref<?xf32>
// CHECK: memref.reinterpret_cast %arg0 to offset: [0], sizes: [67, 30], strides: [30, 1]
// CHECK: memref.reinterpret_cast %arg0 to offset: [[[STACK:[0-9]+]]], sizes: [120, 30], strides: [30, 1]
// CHECK-LABEL: func.func @tiny_tta_embed_kernel
// CHECK: func.func private @fold_0(%arg0: memref<?xf32>, %arg1: memref<?x?xi32>) attributes {lm.fold, lmcc.num_inputs = 1 : i64}
// CHECK: memref.reinterpret_cast %arg0 to offset: [{{[0-9]+}}], sizes: [24, 30], strides: [30, 1]
// CHECK: return
// CHECK-LABEL: func.func @tiny_tta_init_kernel(%arg0: memref<?xf32>) attributes {llvm.emit_c_interface}
// Packing the stacked K/V weight from its one view (the pack function of its shape, called with its offset), then
// every weight of one shape by one function (five 30 x 30 ones here):
// CHECK: %[[AT:.+]] = arith.constant [[STACK]] : index
// CHECK: call @lm_pack_120x30_6x16(%arg0, %[[AT]], %{{.+}}) : (memref<?xf32>, index, index) -> ()
// CHECK-COUNT-5: call @lm_pack_30x30_6x16(%arg0
// CHECK: call @fold_0(%arg0, %{{.+}}) : (memref<?xf32>, memref<?x?xi32>) -> ()
// CHECK: memref.dealloc
// CHECK: func.func private @lm_pack_120x30_6x16(%arg0: memref<?xf32>, %arg1: index, %arg2: index) attributes {no_inline}
// CHECK: memref.reinterpret_cast %arg0 to offset: [%arg1], sizes: [120, 30], strides: [30, 1]
// CHECK: scf.for
// CHECK: func.func private @lm_pack_30x30_6x16(
// CHECK-NOT: func.func private @lm_pack_30x30_6x16(
// CHECK-NOT: lm.
