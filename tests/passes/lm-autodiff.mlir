// RUN: lmcc-opt %s --lm-autodiff | FileCheck %s
// RUN: lmcc emit-mlir --train %models/unilm_base.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-autodiff | FileCheck %s --check-prefix=MODEL
// RUN: lmcc emit-mlir --train %models/tta_base.toml | lmcc-opt --lm-autodiff | FileCheck %s --check-prefix=NAIVE
// lm-autodiff: `loss` is copied to `loss_grad`, whose ops' VJPs run in reverse after the forward; the
// tied table's two uses (embedding and head) sum into one lm.param_grad; dropout in the copy trains.

func.func @loss(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss"} {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %d = lm.dropout %x {rate = 1.000000e-01 : f64, site = 0 : i64} : tensor<?x?x8xf32>
  %a = lm.attention %d, %d, %d, %lengths {heads = 2 : i64, mask = #lm.mask<causal>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  %g = lm.gelu %a : tensor<?x?x8xf32>
  %ce, %lse = lm.token_loss %g, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  return %ce : tensor<?x?xf32>
}

// The forward entry evaluates: its dropouts (identities there) are gone, the rest stays as it was.
// CHECK-LABEL: func.func @loss(
// CHECK-NOT: lm.dropout
// CHECK: lm.attention %{{.*}}, %{{.*}}, %{{.*}}, %arg2
// CHECK-NOT: lm.dropout
// CHECK-LABEL: func.func @loss_grad(
// CHECK-SAME: attributes {lm.method = "loss_grad"}
// CHECK: [[E:%.+]] = lm.weight "embed.token"
// CHECK: [[D:%.+]] = lm.dropout %{{.*}} {rate = 1.000000e-01 : f64, site = 0 : i64, training}
// CHECK: [[A:%.+]] = lm.attention
// CHECK: [[G:%.+]] = lm.gelu [[A]]
// CHECK: %{{.*}}, [[LSE:%.+]] = lm.token_loss [[G]], [[E]]
// CHECK: [[DH:%.+]], [[DW:%.+]], %{{.*}} = lm.token_loss_grad [[G]], [[E]], %arg1, %arg2, [[LSE]]
// CHECK: [[DA:%.+]] = lm.activation_grad [[DH]], [[A]] {kind = "gelu"}
// CHECK: [[DQ:%.+]], [[DK:%.+]], [[DV:%.+]] = lm.attention_grad [[DA]], [[D]], [[D]], [[D]], %arg2
// Three uses of the dropped value: their gradients are summed before the dropout's VJP.
// CHECK: [[S1:%.+]] = lm.add [[DQ]], [[DK]]
// CHECK: [[S2:%.+]] = lm.add [[S1]], [[DV]]
// CHECK: [[DD:%.+]] = lm.dropout_grad [[S2]] {rate = 1.000000e-01 : f64, site = 0 : i64}
// The tied table: the embedding's scatter adds into the head's dense gradient (no zeroed table, no lm.add).
// CHECK: [[T:%.+]] = lm.embed_grad [[DD]], %arg0, %arg2 into([[DW]])
// CHECK-NOT: lm.add
// CHECK: lm.param_grad [[T]] {name = "embed.token"} : tensor<11x8xf32>
// CHECK-NOT: lm.param_grad
// CHECK: return

// The fused uniLM: one gradient per canonical tensor, the fused backward ops.
// MODEL-LABEL: func.func @loss_grad(
// MODEL: lm.token_loss_grad
// MODEL-COUNT-3: lm.attention_grad
// MODEL-DAG: lm.param_grad %{{.*}} {name = "embed.token"} : tensor<30522x512xf32>
// MODEL-DAG: lm.param_grad %{{.*}} {name = "embed.position"} : tensor<128x512xf32>
// MODEL-DAG: lm.param_grad %{{.*}} {name = "layers.2.ffn.out.weight"} : tensor<512x2048xf32>

// The naive T-TA: the decomposed chain's VJPs (no fused op).
// NAIVE-LABEL: func.func @loss_grad(
// NAIVE-NOT: lm.attention_grad
// NAIVE: lm.cross_entropy_grad
// NAIVE: lm.log_softmax_grad
// NAIVE: lm.softmax_grad
// NAIVE: lm.matmul {{.*}} {transpose_lhs}
// NAIVE: lm.positions_grad
// NAIVE: lm.param_grad %{{.*}} {name = "embed.position"}
