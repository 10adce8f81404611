// RUN: lmcc-opt %s --lm-prune-loss-rows | FileCheck %s
// RUN: lmcc-opt %s --lm-prune-loss-rows --lm-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: lmcc emit-mlir --train %inputs/specs/tiny_bilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-prune-loss-rows | FileCheck %s --check-prefix=BILM
// RUN: lmcc emit-mlir --train %inputs/specs/tiny_bilm.toml | lmcc-opt --lm-fuse-attention --lm-prune-loss-rows | FileCheck %s --check-prefix=UNFUSED
// lm-prune-loss-rows: a training loss reads only the rows with a target, so walking back from the loss head's
// hidden states
//   row(op(x))            = op(row(x))                      (row-local ops),
//   row(attention(q,k,v)) = attention(row(q), k, v)          (mask none),
//   row(x)                = lm.gather_rows x, %rows          (anything else, and values needed in full),
// with %rows, %row_targets = lm.target_rows %targets, %lengths, the loss on the packed rows and its per-row
// losses put back by lm.scatter_rows. d_model 8, 2 heads, vocab 11.

// One attention layer under the loss: x feeds the keys and values (in full) and the query and the residual
// (its target rows, one gather shared by both); the head's norm and the loss run on the packed rows.
// CHECK-LABEL: func.func @layer
// CHECK-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[Y:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>)
// CHECK-NEXT: [[R:%.+]], [[RT:%.+]] = lm.target_rows [[Y]], [[LEN]] : (tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xi32>, tensor<?x?xi32>)
// CHECK-DAG: [[X:%.+]] = lm.embed %{{.+}}[[[IDS]]]
// CHECK-DAG: [[XR:%.+]] = lm.gather_rows [[X]], [[R]] : (tensor<?x?x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
// CHECK-DAG: [[Q:%.+]] = lm.linear [[XR]], %{{.+}} : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
// CHECK-DAG: [[K:%.+]] = lm.linear [[X]], %{{.+}} : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
// CHECK-DAG: [[V:%.+]] = lm.linear [[X]], %{{.+}} : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
// CHECK: [[A:%.+]] = lm.attention [[Q]], [[K]], [[V]], [[LEN]] {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32}
// CHECK-NEXT: [[H:%.+]] = lm.add [[XR]], [[A]] : tensor<?x?x8xf32>
// CHECK-NEXT: [[N:%.+]] = lm.layer_norm [[H]]
// CHECK-NEXT: [[CE:%.+]], %{{.+}} = lm.token_loss [[N]], %{{.+}}, [[RT]], [[LEN]] {smoothing = 1.000000e-01 : f64}
// CHECK-NEXT: [[P:%.+]] = lm.scatter_rows [[CE]], [[R]], [[Y]] : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32>
// CHECK-NEXT: return [[P]]
// GRAD-LABEL: func.func @layer_grad
// The loss op's VJP seeds itself; the gather's VJP puts the packed rows' gradient back in place.
// GRAD: lm.token_loss_grad
// GRAD: [[DX:%.+]] = lm.scatter_rows %{{.+}}, %{{.+}}, %{{.+}} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?x?x8xf32>) -> tensor<?x?x8xf32>
// GRAD: lm.add %{{.+}}, [[DX]]
// GRAD: lm.embed_grad
func.func @layer(%ids: tensor<?x?xi32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss"} {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %Wq = lm.weight "q" : tensor<8x8xf32>
  %Wk = lm.weight "k" : tensor<8x8xf32>
  %Wv = lm.weight "v" : tensor<8x8xf32>
  %g = lm.weight "norm.weight" : tensor<8xf32>
  %b = lm.weight "norm.bias" : tensor<8xf32>
  %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %q = lm.linear %x, %Wq : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %k = lm.linear %x, %Wk : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %v = lm.linear %x, %Wv : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %a = lm.attention %q, %k, %v, %len {heads = 2 : i64, mask = #lm.mask<none>, scale = 0.5 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  %h = lm.add %x, %a : tensor<?x?x8xf32>
  %n = lm.layer_norm %h, %g, %b {epsilon = 1.0e-12 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  %ce, %lse = lm.token_loss %n, %E, %y, %len {smoothing = 0.1 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  return %ce : tensor<?x?xf32>
}

// Dropout before the residual (a training spec's sub-layer dropout): the packed rows' dropout takes the rows, so
// each keeps the mask of its row in the full activation; its VJP the same rows.
// CHECK-LABEL: func.func @dropout
// CHECK-NEXT: [[R:%.+]], [[RT:%.+]] = lm.target_rows
// CHECK: [[A:%.+]] = lm.attention
// CHECK-NEXT: lm.dropout [[A]] rows([[R]] : tensor<?x?xi32>) {rate = 1.000000e-01 : f64, site = 2 : i64} : tensor<?x?x8xf32>
// GRAD-LABEL: func.func @dropout_grad
// GRAD: lm.dropout_grad %{{.+}} rows(%rows : tensor<?x?xi32>) {rate = 1.000000e-01 : f64, site = 2 : i64} : tensor<?x?x8xf32>
func.func @dropout(%ids: tensor<?x?xi32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss"} {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %a = lm.attention %x, %x, %x, %len {heads = 2 : i64, mask = #lm.mask<none>, scale = 0.5 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  %d = lm.dropout %a {rate = 0.1 : f64, site = 2 : i64} : tensor<?x?x8xf32>
  %h = lm.add %x, %d : tensor<?x?x8xf32>
  %ce, %lse = lm.token_loss %h, %E, %y, %len {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  return %ce : tensor<?x?xf32>
}

// A causal attention: a query row's keys depend on its position, which the packed rows do not keep; the loss is
// left as it is (no attention to prune, no packing).
// CHECK-LABEL: func.func @causal
// CHECK-NOT: lm.target_rows
// CHECK-NOT: lm.gather_rows
// CHECK: lm.token_loss %{{.+}}, %{{.+}}, %arg1, %arg2
// CHECK-NEXT: return
func.func @causal(%ids: tensor<?x?xi32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss"} {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %a = lm.attention %x, %x, %x, %len {heads = 2 : i64, mask = #lm.mask<causal>, scale = 0.5 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  %h = lm.add %x, %a : tensor<?x?x8xf32>
  %ce, %lse = lm.token_loss %h, %E, %y, %len {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  return %ce : tensor<?x?xf32>
}

// Not a training loss (no lm.method "loss"): untouched.
// CHECK-LABEL: func.func @not_a_loss
// CHECK-NOT: lm.target_rows
// CHECK: return
func.func @not_a_loss(%ids: tensor<?x?xi32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %a = lm.attention %x, %x, %x, %len {heads = 2 : i64, mask = #lm.mask<none>, scale = 0.5 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  %ce, %lse = lm.token_loss %a, %E, %y, %len {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  return %ce : tensor<?x?xf32>
}

// The tiny biLM's loss: layer 0 in full (its output feeds layer 1's keys and values), layer 1's query side, FFN
// and norms, the head transform and the loss on the target rows. The unfused head (without lm-fuse-logprob: the
// vocabulary projection, log_softmax and cross_entropy) runs on the target rows the same way.
// BILM-LABEL: func.func @loss
// BILM-NEXT: [[R:%.+]], [[RT:%.+]] = lm.target_rows %arg1, %arg2
// BILM-NOT: lm.gather_rows
// BILM: [[WQ0:%.+]] = lm.weight "layers.0.attn.q.weight"
// BILM-NEXT: lm.weight "layers.0.attn.q.bias"
// BILM-NEXT: lm.linear %{{.+}}, [[WQ0]], %{{.+}} : (tensor<?x?x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x?x30xf32>
// BILM-NOT: lm.gather_rows
// BILM: [[G0:%.+]] = lm.weight "layers.0.ffn_norm.weight"
// BILM: [[X1:%.+]] = lm.layer_norm %{{.+}}, [[G0]], %{{.+}}
// BILM-NEXT: [[X1R:%.+]] = lm.gather_rows [[X1]], [[R]]
// BILM: [[WQ1:%.+]] = lm.weight "layers.1.attn.q.weight"
// BILM: lm.linear [[X1R]], [[WQ1]]
// BILM: lm.add [[X1R]], %{{.+}}
// BILM-NOT: lm.gather_rows
// BILM: lm.token_loss %{{.+}}, %{{.+}}, %{{.+}}, [[RT]], %arg2
// BILM-NEXT: lm.scatter_rows %{{.+}}, [[R]], %arg1
// UNFUSED-LABEL: func.func @loss
// UNFUSED-NEXT: [[R:%.+]], [[RT:%.+]] = lm.target_rows %arg1, %arg2
// UNFUSED: [[LP:%.+]] = lm.log_softmax %{{.+}} : tensor<?x?x67xf32>
// UNFUSED-NEXT: [[CE:%.+]] = lm.cross_entropy [[LP]], [[RT]], %arg2
// UNFUSED-NEXT: lm.scatter_rows [[CE]], [[R]], %arg1
