// RUN: lmcc emit-mlir %inputs/specs/tiny_tta.toml | lmcc-opt --lm-fuse-attention --lm-hoist-isolated-kv | FileCheck %s
// RUN: lmcc-opt %s --lm-hoist-isolated-kv | FileCheck %s --check-prefix=SMALL
// T-TA's isolated keys/values: the K and V projections of X in every layer become
// one linear over stacked weights before the layer stack; each layer reads a slice.

// CHECK-LABEL: func.func @score
// CHECK: [[X:%.+]] = lm.layer_norm
// CHECK: [[W:%.+]] = lm.concat {{.*}} : (tensor<30x30xf32>, tensor<30x30xf32>, tensor<30x30xf32>, tensor<30x30xf32>) -> tensor<120x30xf32>
// CHECK: [[B:%.+]] = lm.concat {{.*}} -> tensor<120xf32>
// CHECK: [[KV:%.+]] = lm.linear [[X]], [[W]], [[B]] : ({{.*}}) -> tensor<?x?x120xf32>
// CHECK: [[K0:%.+]] = lm.slice_features [[KV]] {offset = 0 : i64, size = 30 : i64}
// CHECK: [[V0:%.+]] = lm.slice_features [[KV]] {offset = 30 : i64, size = 30 : i64}
// CHECK: [[K1:%.+]] = lm.slice_features [[KV]] {offset = 60 : i64, size = 30 : i64}
// CHECK: [[V1:%.+]] = lm.slice_features [[KV]] {offset = 90 : i64, size = 30 : i64}
// CHECK: lm.attention %{{.+}}, [[K0]], [[V0]]
// CHECK: lm.attention %{{.+}}, [[K1]], [[V1]]
// CHECK-NOT: lm.weight "layers.1.attn.k.weight"
// CHECK-LABEL: func.func @embed

// SMALL-LABEL: func.func @qkv
func.func @qkv(%x: tensor<?x?x8xf32>, %y: tensor<?x?x8xf32>) -> (tensor<?x?x8xf32>, tensor<?x?x4xf32>, tensor<?x?x8xf32>) {
  // SMALL: [[W:%.+]] = lm.concat %{{.+}}, %{{.+}} : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<12x8xf32>
  // SMALL: [[Y:%.+]] = lm.linear %arg0, [[W]] : (tensor<?x?x8xf32>, tensor<12x8xf32>) -> tensor<?x?x12xf32>
  // SMALL: lm.slice_features [[Y]] {offset = 0 : i64, size = 8 : i64}
  // SMALL: lm.slice_features [[Y]] {offset = 8 : i64, size = 4 : i64}
  // A projection of another input is left alone.
  // SMALL: lm.linear %arg1
  %wq = lm.weight "q.weight" : tensor<8x8xf32>
  %q = lm.linear %x, %wq : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %wk = lm.weight "k.weight" : tensor<4x8xf32>
  %k = lm.linear %x, %wk : (tensor<?x?x8xf32>, tensor<4x8xf32>) -> tensor<?x?x4xf32>
  %wo = lm.weight "o.weight" : tensor<8x8xf32>
  %o = lm.linear %y, %wo : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  return %q, %k, %o : tensor<?x?x8xf32>, tensor<?x?x4xf32>, tensor<?x?x8xf32>
}
